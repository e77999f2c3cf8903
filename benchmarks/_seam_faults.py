"""The faults `bench_seams.py` injects to make an engine fail mid-answer after N tokens.

- `InjectedLocalFault`: the real `LlamaCppEngine` (every capability its own), whose `stream()`
  raises `LocalEngineError` after `fail_after` text deltas while that is set (None: no fault).
- `cloud_cut`: where a `FaultProxy` must reset the stand-in cloud's response so that exactly N
  content deltas reach the client: the same request is sent once straight to the server, and the
  byte offset half-way into its (N+1)-th content event is read off the raw response (head,
  chunked framing and all: what the proxy counts). Greedy decoding makes the bytes repeat
  (ids and timestamps are of fixed length); every cloud request goes on its own connection
  (`Connection: close`), so the proxy's per-connection count starts at that response.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from hybridllm import LlamaCppEngine
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import LocalEngineError
from hybridllm.events import Chunk, Delta

__all__ = ["InjectedLocalFault", "cloud_cut"]

_EVENT = re.compile(rb"data: ([^\n]*)\n\n")


class InjectedLocalFault(LlamaCppEngine):
    """The real local engine with an injected fault: while `fail_after` is set, each answer it
    streams fails with `LocalEngineError` after that many text deltas (the model is real, the
    failure is not)."""

    fail_after: int | None = None

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        n = 0
        async with aclosing(super().stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk
                if isinstance(chunk, Delta) and chunk.text:
                    n += 1
                    if self.fail_after is not None and n >= self.fail_after:
                        raise LocalEngineError("injected fault (bench_seams)", engine=self.name)


def cloud_cut(port: int, body: Mapping[str, Any], api_key: str, tokens: int) -> int | None:
    """The byte offset in the server's raw response to `body` (POST /v1/chat/completions on
    127.0.0.1:`port`) half-way into its (`tokens`+1)-th content event; None: the answer has
    no more than `tokens` content events (nothing to cut)."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(head + payload)
        while chunk := sock.recv(65536):
            data += chunk
            spans = _content_events(data)
            if len(spans) > tokens:
                start = spans[tokens - 1][1] if tokens else spans[0][0]
                return start + (spans[tokens][1] - start) // 2
    return None


def _content_events(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each complete SSE event in `data` whose delta carries text."""
    spans = []
    for m in _EVENT.finditer(data):
        try:
            event = json.loads(m.group(1))
        except ValueError:
            continue  # "[DONE]", or not an event
        choices = event.get("choices") or [{}]
        if (choices[0].get("delta") or {}).get("content"):
            spans.append((m.start(), m.end()))
    return spans
