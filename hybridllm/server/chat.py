"""``POST /v1/chat/completions``: OpenAI's shapes, streaming (SSE) and not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from hybridllm import errors
from hybridllm.engines import validate
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.llama.served import Prepared, ServedModel
from hybridllm.engines.llama.toolcalls import ParsedCall
from hybridllm.server.schema import ApiError, ChatBody
from hybridllm.tools import tool_spec


def request_for(body: ChatBody, n_ctx: int) -> GenerationRequest:
    """The request; with vLLM's `continue_final_message` the final message must be the
    assistant's, and it is continued (the template's assistant turn left open: its text is the
    answer's start, `assistant_prefix`), as vLLM does."""
    messages = [m.message() for m in body.messages]
    prefix = ""
    if body.continue_final_message:
        if body.add_generation_prompt:
            raise ApiError(
                400,
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message",
            )
        if messages[-1]["role"] != "assistant" or len(messages) < 2:
            raise ApiError(
                400,
                "continue_final_message needs a final assistant message after another message",
                param="messages",
            )
        prefix = messages.pop()["content"]
    elif not body.add_generation_prompt:
        raise ApiError(
            400,
            "add_generation_prompt false is only supported with continue_final_message",
            param="add_generation_prompt",
        )
    try:
        tools = tool_spec(body.tools, body.tool_choice, body.response_format)
        if any("tool_calls" in m or "tool_call_id" in m for m in messages):
            messages = list(validate.messages(messages))  # a tool loop: each result answers a call
        return GenerationRequest(
            tools=tools,
            messages=messages,
            assistant_prefix=prefix,
            max_tokens=body.max_completion_tokens or body.max_tokens or n_ctx,
            temperature=body.temperature,
            top_p=body.top_p,
            stop=body.stops(),
            seed=body.seed,
        )
    except errors.InvalidArgumentError as exc:
        raise ApiError(400, str(exc), param=exc.argument) from exc


def _usage(prepared: Prepared, completion_tokens: int) -> dict[str, int]:
    n = len(prepared.tokens)
    return {
        "prompt_tokens": n,
        "completion_tokens": completion_tokens,
        "total_tokens": n + completion_tokens,
    }


async def complete(model: ServedModel, prepared: Prepared) -> dict[str, Any]:
    parts: list[str] = []
    finish, completion_tokens = "stop", 0
    calls: list[ParsedCall] = []
    async with aclosing(model.chat(prepared)) as pieces:
        async for text, gen in pieces:
            parts.append(text)
            finish, completion_tokens = gen.finish_reason or "stop", gen.completion_tokens
            calls = gen.calls
    message: dict[str, Any] = {"role": "assistant", "content": "".join(parts)}
    if calls:  # OpenAI's shape: the calls, and no content unless text came before them
        message["content"] = message["content"] or None
        message["tool_calls"] = [_call(c) for c in calls]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.alias,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": _usage(prepared, completion_tokens),
    }


async def stream(
    model: ServedModel, prepared: Prepared, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE events: a role chunk, content chunks, a finish chunk, the usage chunk when asked
    for, ``[DONE]``. An error after the headers went out is an ``error`` event."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model.alias,
    }

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        if include_usage:
            extra.setdefault("usage", None)
        return f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode()

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}])

    yield delta({"role": "assistant", "content": ""})
    finish, completion_tokens, sent = "stop", 0, 0
    try:
        async with aclosing(model.chat(prepared)) as pieces:
            async for text, gen in pieces:
                if text:
                    yield delta({"content": text})
                for call in gen.calls[sent:]:  # each call whole, in one chunk
                    yield delta({"tool_calls": [{"index": sent, **_call(call)}]})
                    sent += 1
                finish, completion_tokens = gen.finish_reason or "stop", gen.completion_tokens
    except errors.HybridError as exc:
        body = {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
        yield f"data: {json.dumps(body)}\n\n".encode()
        return
    yield delta({}, finish)
    if include_usage:
        yield event([], usage=_usage(prepared, completion_tokens))
    yield b"data: [DONE]\n\n"


def _call(call: ParsedCall) -> dict[str, Any]:
    """A call in OpenAI's shape."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
