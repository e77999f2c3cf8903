"""Dialect (a), llama-cpp-python's server: `/v1/completions` with `echo`, `logprobs` and
`max_tokens: 1` (started with `--logits_all true`).

llama-cpp-python 0.3.36 builds echo log-probabilities by pairing the entries
(prompt tokens, then the generated one) with its score rows, one row per evaluated prompt token,
row i being the distribution AFTER prompt token i. A prompt that starts with the BOS token
(SmolLM2: BOS is `<|im_start|>`, so every ChatML prompt does) loses that token's entry, so entry
i carries the row that predicts token i itself (`shift` 0) and the generated token keeps its
entry. Any other prompt (Qwen has no BOS token) keeps every entry, so entry i's row predicts
token i+1 (`shift` 1) and the pairing runs out of rows before the generated token: it has no
entry, and the last entry's row is the one that chose it. Later BOS entries are left out, with
their rows. Which reading holds is read from each answer: the right one predicts most echoed
tokens, and the row it says chose the generated (greedy) token names it. Token
strings are detokenized with special tokens as "" and broken UTF-8 dropped, so the verdict is
text-level: the server's own tokenization of the drafted text decides, and the cloud's greedy
string is committed. Where those strings cannot say what was meant (a greedy token of "",
which is the end of the answer or a piece of a character split over tokens; echoed text that
does not end with the draft) the round raises `Unverifiable`, and the plan streams the rest
plainly from the committed text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridllm import errors
from hybridllm.engines.capabilities import VerificationPost
from hybridllm.runtime.plans.speculative.verifier import (
    Dialect,
    Round,
    Unverifiable,
    Verdict,
    billed_usage,
    first_choice,
    greedy_and_gap,
    text_verdict,
)


@dataclass
class EchoVerifier:
    """llama-cpp-python's `/v1/completions` with `echo`, `logprobs` and `max_tokens: 1`."""

    shift: int = 1  # the reading when an answer does not tell (see `echo_shift`)
    dialect: Dialect = "echo-logprobs"
    token_level: bool = False
    samples: bool = False

    async def verify(self, round_: Round, post: VerificationPost) -> Verdict:
        body = {
            "prompt": round_.prompt_text + round_.committed_text + round_.draft_text,
            "echo": True,
            "logprobs": 2,
            "max_tokens": 1,
            "temperature": 0.0,
        }
        data = await post("completions", body)
        return read_echo(data, round_, echo_shift(data, self.shift))


def read_echo(data: Mapping[str, Any], round_: Round, shift: int | None) -> Verdict:
    """The verdict from an echo answer (see the module for the shift)."""
    choice = first_choice(data)
    lp = choice.get("logprobs") or {}
    tokens: list[str] = list(lp.get("tokens") or [])
    top: list[Mapping[str, float] | None] = list(lp.get("top_logprobs") or [])
    if not tokens or len(top) != len(tokens) or shift is None:
        raise errors.CloudProtocolError("verification: echo answer without log-probabilities")
    usage = billed_usage(data)
    n_prompt = _prompt_entries(choice, len(tokens), usage.completion_tokens, shift)
    draft = round_.draft_text
    # where the draft starts in the echoed prompt (entries' texts, concatenated)
    starts, pos = [], 0
    for t in tokens[:n_prompt]:
        starts.append(pos)
        pos += len(t)
    boundary = pos - len(draft)
    if not "".join(tokens[:n_prompt]).endswith(draft):
        raise Unverifiable("the echoed text does not end with the draft (split characters)")
    accepted_text, i = "", 0
    while i < n_prompt and starts[i] + len(tokens[i]) <= boundary:
        i += 1
    gap: float | None = None
    for j in range(i, n_prompt):
        dist = top[j - shift] if j - shift >= 0 else None
        if not dist:
            raise errors.CloudProtocolError("verification: no distribution for a draft token")
        want, gap = greedy_and_gap(dist)
        if want != tokens[j]:
            if want == "":
                raise Unverifiable(
                    "the greedy token reads as nothing (an end or a split character)"
                )
            return text_verdict(round_, accepted_text, want, False, usage, gap)
        accepted_text += tokens[j][max(0, boundary - starts[j]) :]
    if not _generated(choice, usage.completion_tokens):  # the answer ended right after the draft
        return text_verdict(round_, accepted_text, "", True, usage, None)
    # every drafted token agreed: the cloud's own token is the generated one, named by its
    # entry, or (it has none: shift 1) by the row that chose it
    dist = top[n_prompt - shift] if n_prompt - shift >= 0 else None
    gap = greedy_and_gap(dist)[1] if dist else None
    own = tokens[n_prompt] if n_prompt < len(tokens) else (greedy_and_gap(dist)[0] if dist else "")
    if own == "":
        raise Unverifiable("the generated token reads as nothing (a split character)")
    return text_verdict(round_, accepted_text, own, False, usage, gap)


def _generated(choice: Mapping[str, Any], completion_tokens: int) -> bool:
    """Whether the answer generated a token (an end of the answer generates none)."""
    return completion_tokens >= 1 or choice.get("finish_reason") == "length"


def _prompt_entries(
    choice: Mapping[str, Any], n_entries: int, completion_tokens: int, shift: int
) -> int:
    """How many entries are the echoed prompt's: all but the generated token's, which has an
    entry only when the rows are not shifted (see the module)."""
    return n_entries - (1 if shift == 0 and _generated(choice, completion_tokens) else 0)


def echo_shift(data: Mapping[str, Any], default: int | None = None) -> int | None:
    """Which rows predict which tokens in an echo answer: 0 (entry i's row predicts token i, and
    the generated token has an entry) or 1 (it predicts token i+1, and the generated token has
    none). Each reading scores the echoed prompt tokens its rows predict, plus a bonus when the
    row it says chose the generated (greedy) token names it. None (or `default`): neither
    reading predicts the text (e.g. a server without --logits_all)."""
    choice = first_choice(data)
    lp = choice.get("logprobs") or {}
    tokens, top = list(lp.get("tokens") or []), list(lp.get("top_logprobs") or [])
    if len(tokens) < 4 or len(top) != len(tokens):
        return default
    c_tok = billed_usage(data).completion_tokens
    text = str(choice.get("text") or "")
    scores = {}
    for shift in (0, 1):
        last = _prompt_entries(choice, len(tokens), c_tok, shift)
        pairs = [(top[i - shift], tokens[i]) for i in range(2, last)]
        hits = sum(1 for d, t in pairs if d and greedy_and_gap(d)[0] == t)
        chose = top[last - shift] if _generated(choice, c_tok) and last - shift >= 0 else None
        named = greedy_and_gap(chose)[0] if chose else ""
        gen = tokens[last] == named if last < len(tokens) else text.endswith(named)
        bonus = 0.5 if named and gen else 0.0
        scores[shift] = hits / max(1, len(pairs)) + bonus
    shift = max(scores, key=lambda s: scores[s])
    if scores[shift] >= 0.5 and scores[shift] > scores[1 - shift]:
        return shift
    return default
