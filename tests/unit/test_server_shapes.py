"""hybridllm.server's request checks and vLLM-shaped answers, without a model (no llama.cpp).

The scores are built by hand; the integration tests (tests/integration/test_serve.py) check the
same shapes against a real model and server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hybridllm.engines.llama.score import TOP_K, Scores
from hybridllm.engines.llama.served import Completion
from hybridllm.server import completions
from hybridllm.server.schema import ApiError, ChatBody, CompletionBody, parse


class FakeModel:
    alias = "m"
    model = "m"

    def piece(self, token: int) -> str:
        return f"<{token}>"

    def text(self, tokens: list[int]) -> str:
        return "".join(self.piece(t) for t in tokens)


def scores_for(tokens: list[int]) -> Scores:
    n = len(tokens)
    top_ids = np.tile(np.arange(100, 100 + TOP_K), (n, 1))
    top_lp = np.tile(-np.arange(1, TOP_K + 1, dtype=np.float32) / 4, (n, 1))
    logprob = np.full(n, -7.0, dtype=np.float32)
    rank = np.full(n, 50)
    logprob[2], rank[2] = top_lp[1, 0], 1  # tokens[2] is the top choice after tokens[:2]
    return Scores(logprob, rank, top_ids, top_lp, evaluated=n, reused=0)


def answer(body: dict[str, Any], tokens: list[int], out: Completion) -> dict[str, Any]:
    model: Any = FakeModel()
    return completions.response(model, parse(CompletionBody, body), tokens, out)


def test_prompt_logprobs_are_vllms_list_of_dicts() -> None:
    tokens = [5, 6, 100, 7]
    out = Completion(finish_reason="length", prompt_scores=scores_for(tokens))
    body = {"model": "m", "prompt": tokens, "max_tokens": 0, "prompt_logprobs": 2, "echo": True}
    choice = answer(body, tokens, out)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(tokens)
    # the prompt's own token first, then the top 2; not repeated when it is one of them
    assert list(entries[1]) == ["6", "100", "101"]
    assert entries[1]["6"] == {"logprob": -7.0, "rank": 50, "decoded_token": "<6>"}
    assert entries[1]["101"] == {"logprob": -0.5, "rank": 2, "decoded_token": "<101>"}
    assert list(entries[2]) == ["100", "101"] and entries[2]["100"]["rank"] == 1
    assert choice["text"] == "<5><6><100><7>" and choice["logprobs"] is None


def test_token_names_as_ids_and_legacy_logprobs_with_echo() -> None:
    tokens = [5, 6, 100]
    scores = scores_for(tokens + [9])
    out = Completion(tokens=[9], text="<9>", prompt_scores=scores, output_scores=scores)
    body = {
        "model": "m",
        "prompt": tokens,
        "max_tokens": 1,
        "logprobs": 1,
        "echo": True,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    ans = answer(body, tokens, out)
    lp = ans["choices"][0]["logprobs"]
    assert lp["tokens"] == ["token_id:5", "token_id:6", "token_id:100", "token_id:9"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {"token_id:100": -0.25}
    assert ans["choices"][0]["token_ids"] == [9] and ans["choices"][0]["prompt_token_ids"] == tokens
    assert ans["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


@pytest.mark.parametrize(
    ("cls", "body", "param"),
    [
        (CompletionBody, {"model": "m", "prompt": "x", "prompt_logprobs": 1025}, "prompt_logprobs"),
        (CompletionBody, {"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        (CompletionBody, {"model": "m", "prompt": "x", "n": 2}, "n"),
        (CompletionBody, {"model": "m", "prompt": {"a": 1}}, "prompt"),
        (ChatBody, {"model": "m", "messages": []}, "messages"),
        (ChatBody, {"model": "m", "messages": [{"role": "x", "content": "y"}]}, "messages"),
        (ChatBody, {"model": "", "messages": [{"role": "user"}]}, "model"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(cls: Any, body: Any, param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(cls, body)
    assert info.value.status == 400 and str(info.value.param).startswith(param)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_stream_on_completions_is_refused() -> None:
    body = parse(CompletionBody, {"model": "m", "prompt": [1], "stream": True})
    with pytest.raises(ApiError, match="stream"):
        completions.job_for(body, [1], 20)


# ---- chat: vLLM's continue_final_message and OpenAI's logit_bias -----------------------------


def chat_body(**extra: Any) -> ChatBody:
    msgs = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "1, 2,"}]
    return parse(ChatBody, {"model": "m", "messages": msgs, **extra})


def test_continue_final_message_continues_the_assistant_text() -> None:
    from hybridllm.server.chat import request_for

    req = request_for(chat_body(continue_final_message=True, add_generation_prompt=False), 512)
    assert list(req.messages) == [{"role": "user", "content": "Count."}]
    assert req.assistant_prefix == "1, 2,"
    plain = request_for(chat_body(), 512)  # without it: a new turn after the assistant's
    assert plain.assistant_prefix == "" and len(plain.messages) == 2


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"continue_final_message": True}, "continue_final_message"),  # generation prompt on
        ({"add_generation_prompt": False}, "add_generation_prompt"),
    ],
)
def test_continue_final_message_misuse_is_400(extra: dict[str, Any], param: str) -> None:
    from hybridllm.server.chat import request_for

    with pytest.raises(ApiError) as err:
        request_for(chat_body(**extra), 512)
    assert err.value.status == 400 and err.value.param == param


def test_continue_final_message_needs_a_final_assistant_message() -> None:
    from hybridllm.server.chat import request_for

    body = parse(
        ChatBody,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Count."}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    )
    with pytest.raises(ApiError) as err:
        request_for(body, 512)
    assert err.value.status == 400 and err.value.param == "messages"


def test_logit_bias_keys_are_token_ids_and_biases_in_range() -> None:
    assert chat_body(logit_bias={"0": -100, "17": 2.5}).bias() == {0: -100.0, 17: 2.5}
    assert chat_body().bias() == {}
    for bad in ({"x": 1}, {"3": -101}, {"3": 100.5}):
        with pytest.raises(ApiError) as err:
            chat_body(logit_bias=bad).bias()
        assert err.value.status == 400 and err.value.param == "logit_bias"


def test_more_log_probabilities_than_the_servers_max_are_refused() -> None:
    body = parse(CompletionBody, {"model": "m", "prompt": [1], "prompt_logprobs": 21})
    with pytest.raises(ApiError, match="at most 20") as info:
        completions.job_for(body, [1], 20)
    assert info.value.param == "prompt_logprobs"
    assert completions.job_for(body, [1], 64).score
