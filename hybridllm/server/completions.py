"""``POST /v1/completions`` in vLLM's dialect: raw prompts, ``echo``, ``logprobs`` and
``prompt_logprobs`` (the shape is described in `hybridllm.server`'s docstring)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from hybridllm.engines.llama.served import Completion, CompletionJob, Scores, ServedModel
from hybridllm.server.schema import ApiError, CompletionBody


def prompt_tokens(model: ServedModel, body: CompletionBody) -> list[int]:
    """The prompt as token ids: a string (tokenized as is, no BOS added), or token ids."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    elif isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        raise ApiError(400, "only one prompt per request is supported", param="prompt")
    if isinstance(prompt, str):
        tokens = model.tokenize(prompt)
    else:
        tokens = list(prompt)
        vocab = model.n_vocab()
        if any(t < 0 or t >= vocab for t in tokens):
            raise ApiError(400, f"token ids must be from 0 to {vocab - 1}", param="prompt")
    if not tokens:
        raise ApiError(400, "the prompt is empty", param="prompt")
    return tokens


def job_for(body: CompletionBody, tokens: list[int], max_logprobs: int) -> CompletionJob:
    for name in ("logprobs", "prompt_logprobs"):
        asked = getattr(body, name)
        if asked is not None and asked > max_logprobs:
            raise ApiError(
                400, f"{name}: at most {max_logprobs} (the server's --max-logprobs)", param=name
            )
    if body.stream:
        raise ApiError(400, "stream is not supported on /v1/completions here", param="stream")
    wants_prompt = body.prompt_logprobs is not None or (body.echo and body.logprobs is not None)
    return CompletionJob(
        tokens=tokens,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stops(),
        score=wants_prompt,
        score_output=body.logprobs is not None and body.max_tokens > 0,
    )


class _Names:
    """A token's name in a response: its text, or ``token_id:N`` when asked for."""

    def __init__(self, model: ServedModel, as_ids: bool) -> None:
        self.model, self.as_ids = model, as_ids
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if self.as_ids:
            return f"token_id:{token}"
        name = self._cache.get(token)
        if name is None:
            name = self._cache[token] = self.model.piece(token)
        return name


def _prompt_logprobs(
    scores: Scores, tokens: list[int], k: int, names: _Names
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's list: None, then per position {token_id: {logprob, rank, decoded_token}}: the
    prompt's own token first, then the top k (best first)."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for p in range(1, len(tokens)):
        entry = {
            str(tokens[p]): {
                "logprob": float(scores.logprob[p]),
                "rank": int(scores.rank[p]),
                "decoded_token": names(tokens[p]),
            }
        }
        for r in range(k):
            t = int(scores.top_ids[p - 1, r])
            entry.setdefault(
                str(t),
                {
                    "logprob": float(scores.top_logprobs[p - 1, r]),
                    "rank": r + 1,
                    "decoded_token": names(t),
                },
            )
        out.append(entry)
    return out


def _legacy_logprobs(
    scores: Scores | None, tokens: list[int], first: int, k: int, names: _Names
) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs`` for tokens[first:] (None for position 0)."""
    result: dict[str, Any] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    offset = 0
    for p in range(first, len(tokens)):
        name = names(tokens[p])
        result["tokens"].append(name)
        result["text_offset"].append(offset)
        offset += len(name)
        if p == 0:
            result["token_logprobs"].append(None)
            result["top_logprobs"].append(None)
            continue
        assert scores is not None
        result["token_logprobs"].append(float(scores.logprob[p]))
        top = {
            names(int(scores.top_ids[p - 1, r])): float(scores.top_logprobs[p - 1, r])
            for r in range(k)
        }
        result["top_logprobs"].append(top)
    return result


def response(
    model: ServedModel, body: CompletionBody, tokens: list[int], out: Completion
) -> dict[str, Any]:
    names = _Names(model, body.return_tokens_as_token_ids)
    text = out.text
    if body.echo:
        text = model.text(tokens) + text
    logprobs = None
    if body.logprobs is not None:
        scores = out.output_scores or out.prompt_scores
        start = 0 if body.echo else len(tokens)
        seq = (tokens + out.tokens) if scores is not None else tokens[:start]  # none to show
        logprobs = _legacy_logprobs(scores, seq, start, body.logprobs, names)
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    if body.prompt_logprobs is not None:
        assert out.prompt_scores is not None
        choice["prompt_logprobs"] = _prompt_logprobs(
            out.prompt_scores, tokens, body.prompt_logprobs, names
        )
    if body.return_token_ids:
        choice["prompt_token_ids"] = tokens
        choice["token_ids"] = out.tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.alias,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(tokens),
            "completion_tokens": len(out.tokens),
            "total_tokens": len(tokens) + len(out.tokens),
        },
    }
