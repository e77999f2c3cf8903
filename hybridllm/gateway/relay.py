"""A request's events (`Stream.events()`) relayed as the gateway's answer: SSE chunks as they
come, or one ``chat.completion`` at the end (the shapes are `gateway.shapes`')."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

from hybridllm import errors
from hybridllm.events import Done, Event, Token, ToolCall
from hybridllm.gateway import shapes, wire
from hybridllm.runtime.stream import Stream
from hybridllm.server.schema import ApiError

__all__ = ["Whole", "api_error", "sse", "whole"]


# each refusal's HTTP answer (status, code, type), the first class that matches wins
_ANSWERS: tuple[tuple[type[errors.HybridError], int, str, str], ...] = (
    (errors.PrivacyBlockedError, 403, "privacy_blocked", "permission_error"),
    (errors.BudgetExceededError, 402, "budget_exceeded", "insufficient_quota"),
    (errors.RefusedError, 403, "refused", "permission_error"),
    (errors.QueueFullError, 503, "engine_busy", "server_error"),
    (errors.EngineError, 502, "engine_error", "server_error"),
)


def api_error(exc: errors.HybridError) -> ApiError:
    """A hybridllm error as the HTTP error the gateway answers (docs/gateway.md's table):
    a privacy refusal 403, a budget refusal 402 (``insufficient_quota``), a user's rate limit
    429 with Retry-After, a bad argument 400 naming it, a busy local queue 503, an engine
    failure 502."""
    if isinstance(exc, errors.ContextOverflowError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, errors.RateLimitedError):  # when the user's minute ends
        wait = {"retry-after": str(max(1, math.ceil(exc.retry_after_s)))}
        return ApiError(
            429, str(exc), code="rate_limit_exceeded", type="rate_limit_error", headers=wait
        )
    for kind, status, code, type_ in _ANSWERS:
        if isinstance(exc, kind):
            return ApiError(status, str(exc), code=code, type=type_)
    if isinstance(exc, errors.InvalidArgumentError):
        return ApiError(400, str(exc), param=wire.ARGUMENT_PARAMS.get(exc.argument, exc.argument))
    if isinstance(exc, errors.ConfigError):
        return ApiError(400, str(exc))
    return ApiError(500, str(exc), type="server_error")


async def first_event(stream: Stream) -> tuple[AsyncIterator[Event], Event | None]:
    """The stream's events and the first of them: admission's refusal or bad argument comes
    here, as an `ApiError`, before any response is sent (the stream closed)."""
    events = stream.events()
    try:
        return events, await anext(events, None)
    except errors.HybridError as exc:
        await stream.aclose()
        raise api_error(exc) from exc


async def _chain(first: Event | None, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    if first is None:
        return
    yield first
    async for event in rest:
        yield event


async def sse(
    stream: Stream, events: AsyncIterator[Event], first: Event | None, call: wire.ChatCall
) -> AsyncIterator[bytes]:
    """The SSE body. Leaving it (the client went away: Starlette cancels the response) closes
    the stream, which stops every engine; an error after the headers is an ``error`` event."""
    answer = shapes.Answer(call.model)
    extra: dict[str, Any] = {"usage": None} if call.include_usage else {}
    spans, n_calls = shapes.Spans(), 0
    async with stream:
        yield answer.delta({"role": "assistant", "content": ""}, **extra)
        try:
            async for event in _chain(first, events):
                if isinstance(event, Token):
                    spans.add(event.engine, event.text)
                    mark = {"engine": event.engine}
                    yield answer.delta({"content": event.text}, hybridllm=mark, **extra)
                elif isinstance(event, ToolCall):
                    shape = {"index": n_calls, **shapes.call_shape(event)}
                    n_calls += 1
                    mark = {"engine": event.engine}
                    yield answer.delta({"tool_calls": [shape]}, hybridllm=mark, **extra)
                elif isinstance(event, Done):
                    found = shapes.decision(event.trace, spans)
                    yield answer.delta({}, event.finish_reason, hybridllm=found, **extra)
                    if call.include_usage:
                        yield answer.chunk([], usage=shapes.usage(event.trace))
        except errors.HybridError as exc:
            yield f"data: {json.dumps(api_error(exc).body())}\n\n".encode()
            return
    yield shapes.DONE


class Whole:
    """A non-streamed answer: the body and its ``x-hybridllm-*`` headers."""

    def __init__(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.body, self.headers = body, headers


async def whole(
    stream: Stream, events: AsyncIterator[Event], first: Event | None, call: wire.ChatCall
) -> Whole:
    """The whole answer, collected from the events (a failure is its `ApiError`)."""
    spans, pieces, calls = shapes.Spans(), list[str](), list[ToolCall]()
    async with stream:
        try:
            async for event in _chain(first, events):
                if isinstance(event, Token):
                    spans.add(event.engine, event.text)
                    pieces.append(event.text)
                elif isinstance(event, ToolCall):
                    calls.append(event)
        except errors.HybridError as exc:
            raise api_error(exc) from exc
    found = shapes.decision(stream.trace, spans)
    body = shapes.Answer(call.model).completion("".join(pieces), calls, stream.trace, found)
    return Whole(body, shapes.decision_headers(found))
