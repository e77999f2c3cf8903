"""Dialect (b) read at text level (the tokenizers differ): answers in vLLM's documented
`prompt_logprobs` shape with `return_token_ids`, built here by hand (named as such)."""

from __future__ import annotations

from typing import Any

import pytest

from hybridllm.runtime.plans.speculative.dialect_vllm import read_text_logprobs
from hybridllm.runtime.plans.speculative.verifier import Round, Unverifiable


def answer(tokens: list[tuple[str, int, str]], gen: str, finish: str = "length") -> dict[str, Any]:
    """tokens: (text, rank of this token, the top-1's text when it is not this one)."""
    ids, plp = [], [None]
    for i, (text, rank, best) in enumerate(tokens):
        ids.append(100 + i)
        if i == 0:
            continue
        e = {str(100 + i): {"logprob": -0.1 if rank == 1 else -2.0, "rank": rank,
                            "decoded_token": text}}  # fmt: skip
        if rank != 1:
            e["999"] = {"logprob": -0.5, "rank": 1, "decoded_token": best}
        e["998"] = {"logprob": -4.0, "rank": 2 if rank == 1 else 3, "decoded_token": "z"}
        plp.append(e)
    return {
        "choices": [{"index": 0, "text": gen, "finish_reason": finish, "prompt_logprobs": plp,
                     "prompt_token_ids": ids,
                     "logprobs": {"tokens": [gen], "top_logprobs": [{gen: -0.1, "q": -3.0}]}}],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": 1},
    }  # fmt: skip


# the local model drafted " blue sky" as three pieces after the committed "The"
ROUND = Round("<p>", "The", [1, 2, 3], [7, 8, 9], [" bl", "ue", " sky"])
PROMPT = [("<p>", 1, ""), ("The", 1, "")]


def test_the_servers_own_tokens_decide_and_its_next_token_follows() -> None:
    ok = answer([*PROMPT, (" blue", 1, ""), (" sky", 1, "")], " is")
    v = read_text_logprobs(ok, ROUND)
    assert (v.accepted, v.accepted_text, v.text, v.switch) == (3, " blue sky", " blue sky is", None)
    assert v.gap == pytest.approx(2.9)
    no = answer([*PROMPT, (" blue", 1, ""), (" sky", 4, " sea")], " is")
    v = read_text_logprobs(no, ROUND)
    assert (v.accepted, v.accepted_text, v.text) == (2, " blue", " blue sea")
    assert v.gap == pytest.approx(3.5)


def test_a_token_across_the_committed_text_and_the_draft() -> None:
    r = Round("<p>", "Th", [1, 2, 3], [7], ["e sky"])
    across = answer([("<p>", 1, ""), ("The", 4, "This"), (" sky", 1, "")], ".")
    v = read_text_logprobs(across, r)  # the server's "This" keeps the committed "Th"
    assert (v.accepted, v.accepted_text, v.text) == (0, "", "is")
    ends = answer([("<p>", 1, ""), ("The", 4, "Th"), (" sky", 1, "")], ".")
    v = read_text_logprobs(ends, r)  # its choice ends where the draft starts: no text
    assert v.text == "" and v.switch is not None
    rewrite = answer([("<p>", 1, ""), ("The", 4, "A"), (" sky", 1, "")], ".")
    with pytest.raises(Unverifiable, match="rewrite committed text"):
        read_text_logprobs(rewrite, r)
    split = answer([*PROMPT, (" bl\ufffd", 1, ""), ("sky", 1, "")], ".")
    with pytest.raises(Unverifiable, match="do not spell the draft"):
        read_text_logprobs(split, ROUND)
    end = answer([*PROMPT, (" blue", 1, ""), (" sky", 1, "")], "", finish="stop")
    assert read_text_logprobs(end, ROUND).finished
