"""The gateway's answers in OpenAI's shapes, with the decision under ``"hybridllm"``.

Streamed (``chat.completion.chunk``): a role chunk; content chunks, each with
``"hybridllm": {"engine": "local" | "cloud"}``; tool calls as ``delta.tool_calls`` (each call
whole in one chunk); the finish chunk, whose ``"hybridllm"`` is the whole `decision`; with
``stream_options.include_usage`` a usage chunk (no choices); ``data: [DONE]``.

Not streamed (``chat.completion``): the message (``tool_calls`` where the answer called tools),
``usage``, the same decision under ``"hybridllm"`` and in `decision_headers`.

The decision: ``engine`` (the one that served the end of the answer), ``plan``, ``policy``,
``ttft_ms``, ``reason`` (the route's), ``cost_usd`` (None: nothing settled) and ``spans``, the
engine of each run of the delivered text in characters (``start`` inclusive, ``end``
exclusive), for a UI that colours the answer.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hybridllm.events import EngineName, ToolCall
from hybridllm.runtime.trace import Trace

__all__ = ["Answer", "Spans", "decision", "decision_headers", "error_body"]


@dataclass
class Spans:
    """Which engine wrote which characters of the delivered text, as it streams."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0

    def add(self, engine: EngineName, text: str) -> None:
        if self.runs and self.runs[-1]["engine"] == engine:
            self.runs[-1]["end"] += len(text)
        else:
            self.runs.append({"engine": engine, "start": self.chars, "end": self.chars + len(text)})
        self.chars += len(text)


def decision(trace: Trace, spans: Spans) -> dict[str, Any]:
    """The ``"hybridllm"`` object of a finished request (see the module)."""
    ttft = trace.ttft_ms
    return {
        "engine": trace.engine,
        "plan": trace.plan,
        "policy": trace.policy,
        "ttft_ms": None if ttft is None else round(ttft, 1),
        "reason": trace.route_reason or "; ".join(trace.reasons),
        "cost_usd": trace.cost_usd,
        "spans": [dict(run) for run in spans.runs],
    }


def decision_headers(found: dict[str, Any]) -> dict[str, str]:
    """The decision as ``x-hybridllm-*`` response headers (no spans), ASCII-safe."""
    names = ("engine", "plan", "policy", "ttft_ms", "cost_usd", "reason")
    return {
        f"x-hybridllm-{name.replace('_', '-')}": _header_value(found[name])
        for name in names
        if found[name] is not None
    }


def _header_value(value: object) -> str:
    """Printable ASCII only: other characters as backslash escapes, controls as spaces."""
    text = str(value).encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if " " <= c <= "~" else " " for c in text)


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def call_shape(call: ToolCall) -> dict[str, Any]:
    """A tool call as OpenAI writes it."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def usage(trace: Trace) -> dict[str, int]:
    prompt, completion = trace.prompt_tokens or 0, trace.completion_tokens or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class Answer:
    """One response's identity (id, created, model) and its shapes."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        """One SSE event of a ``chat.completion.chunk``."""
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    def delta(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self.chunk([choice], **extra)

    def completion(
        self, text: str, calls: list[ToolCall], trace: Trace, found: dict[str, Any]
    ) -> dict[str, Any]:
        """The whole ``chat.completion``."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:  # OpenAI's shape: the calls, and no content unless text came before them
            message["content"] = text or None
            message["tool_calls"] = [call_shape(c) for c in calls]
        finish = trace.finish_reason or ("tool_calls" if calls else "stop")
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage(trace),
            "hybridllm": found,
        }


DONE = b"data: [DONE]\n\n"
