"""Faults a `FaultProxy` injects: the `Faults` settings, heavy-tailed stall draws, and the canned
HTTP answers of HTTP-level faults (error statuses, malformed SSE, keep-alive-only streams)."""

from __future__ import annotations

import asyncio
import http
import itertools
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Faults", "StallDist", "heavy_tail"]

StallDist = Callable[[random.Random], float]
"""Draws one first-byte stall in milliseconds from the proxy's seeded RNG."""


def heavy_tail(
    median_ms: float = 150.0,
    p99_ms: float = 3000.0,
    spike_probability: float = 0.0,
    spike_ms: float = 5000.0,
) -> StallDist:
    """A heavy-tailed stall distribution for ``Faults.first_byte_stall_dist``: lognormal with
    the given median and 99th percentile, plus (with ``spike_probability``) a fixed ``spike_ms``
    stall instead (a request stuck in a queue)."""
    if not 0 < median_ms <= p99_ms:
        raise ValueError(f"need 0 < median_ms <= p99_ms, got {median_ms!r}, {p99_ms!r}")
    if not 0.0 <= spike_probability <= 1.0:
        raise ValueError(f"spike_probability must be in [0, 1], got {spike_probability!r}")
    mu = math.log(median_ms)
    sigma = math.log(p99_ms / median_ms) / 2.3263478740408408  # z of the 99th percentile

    def draw(rng: random.Random) -> float:
        if spike_probability and rng.random() < spike_probability:
            return spike_ms
        return rng.lognormvariate(mu, sigma)

    return draw


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults to inject; all off by default.

    - ``latency_ms``: one-way delay added to every upstream->client chunk (chunks stay in
      order and are pipelined: a steady stream is shifted, not slowed down).
    - ``jitter_ms``: plus a uniform random 0..jitter_ms per chunk (RNG seeded by ``seed``).
    - ``first_byte_stall_ms``: extra delay before the first response byte after each request
      (each time the client sent bytes since the last response byte; with keep-alive, every
      request on a reused connection is stalled, not only the first).
    - ``stall_probability``: the chance that a response gets the stall (1.0: every response);
      draws use the seeded RNG, so a heavy tail is reproducible.
    - ``reset_after_bytes``: forward this many response bytes per connection, then send the
      client a TCP RST (0: reset on the first response byte, before anything is forwarded).
    - ``refuse``: reset every new connection at once (the client sees a connection reset).
    - ``first_byte_stall_dist``: draw each stall (ms) from this function of the RNG instead of
      ``first_byte_stall_ms`` (see :func:`heavy_tail`); ``stall_probability`` still applies.
    - ``seed``: seed for the jitter and stall RNG; ``None`` for a random seed.

    HTTP faults (at most one; each answers the request without contacting the upstream, after
    ``latency_ms`` and any stall, and closes the connection):

    - ``http_status``: a canned response with this status (400-599) and an OpenAI-style JSON
      error body; ``retry_after_s`` adds a ``Retry-After`` header.
    - ``sse_garbage``: ``200 text/event-stream`` with malformed events (``data: {not json``).
    - ``keepalive_only_s``: ``200 text/event-stream`` carrying only SSE comments (``: ping``,
      every ``keepalive_interval_ms``) for this long (``math.inf``: until the client leaves),
      then the end of the stream without a single event.
    - ``fail_first``: apply ``refuse`` and the HTTP faults to the first N connections/requests
      only (counted from when the faults were set); ``None``: to all.
    """

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    first_byte_stall_ms: float = 0.0
    stall_probability: float = 1.0
    reset_after_bytes: int | None = None
    refuse: bool = False
    first_byte_stall_dist: StallDist | None = None
    seed: int | None = None
    http_status: int | None = None
    retry_after_s: float | None = None
    sse_garbage: bool = False
    keepalive_only_s: float | None = None
    keepalive_interval_ms: float = 100.0
    fail_first: int | None = None

    def __post_init__(self) -> None:
        for name in ("latency_ms", "jitter_ms", "first_byte_stall_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"Faults.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("retry_after_s", "keepalive_only_s", "fail_first"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"Faults.{name} must be >= 0, got {value!r}")
        if self.http_status is not None and not 400 <= self.http_status <= 599:
            raise ValueError(f"Faults.http_status must be in 400..599, got {self.http_status!r}")
        if not self.keepalive_interval_ms > 0:
            raise ValueError(
                f"Faults.keepalive_interval_ms must be > 0, got {self.keepalive_interval_ms!r}"
            )
        chosen = [
            self.http_status is not None,
            self.sse_garbage,
            self.keepalive_only_s is not None,
        ]
        if sum(chosen) > 1:
            raise ValueError("choose at most one of http_status, sse_garbage, keepalive_only_s")
        if self.retry_after_s is not None and self.http_status is None:
            raise ValueError("Faults.retry_after_s needs http_status")
        if not 0.0 <= self.stall_probability <= 1.0:
            raise ValueError(
                f"Faults.stall_probability must be in [0, 1], got {self.stall_probability!r}"
            )
        if self.reset_after_bytes is not None and self.reset_after_bytes < 0:
            raise ValueError(f"Faults.reset_after_bytes must be >= 0, got {self.reset_after_bytes}")

    @property
    def http_fault(self) -> str | None:
        """``"HTTP <status>"``, ``"sse_garbage"``, ``"keepalive"`` or None."""
        if self.http_status is not None:
            return f"HTTP {self.http_status}"
        if self.sse_garbage:
            return "sse_garbage"
        if self.keepalive_only_s is not None:
            return "keepalive"
        return None


def _response_head(status: int, headers: dict[str, str]) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    lines = [f"HTTP/1.1 {status} {phrase}"]
    lines += [f"{k}: {v}" for k, v in {**headers, "Connection": "close"}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def canned(faults: Faults) -> Iterator[tuple[float, bytes]]:
    """The response of an HTTP fault as (seconds to wait first, bytes) pieces. Bodies without
    Content-Length end when the connection closes (HTTP/1.1 close-delimited)."""
    sse_head = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    if faults.http_status is not None:
        status = faults.http_status
        kind = {
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_error",
        }
        err = {
            "message": f"injected fault: HTTP {status}",
            "type": kind.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": None,
            "code": status,
        }
        body = json.dumps({"error": err}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        if faults.retry_after_s is not None:
            headers["Retry-After"] = f"{faults.retry_after_s:g}"
        yield 0.0, _response_head(status, headers) + body
    elif faults.sse_garbage:
        yield 0.0, _response_head(200, sse_head)
        yield 0.0, b'data: {not json\n\ndata: {"choices": [{"delta": \n\n'
    elif faults.keepalive_only_s is not None:
        yield 0.0, _response_head(200, sse_head) + b": ping\n\n"
        every = faults.keepalive_interval_ms / 1000.0
        total = faults.keepalive_only_s
        for i in itertools.count(1):
            if i * every > total:
                break
            yield every, b": ping\n\n"
        if math.isfinite(total):
            yield total % every, b""  # the rest of the time, then the stream ends


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request: (head through the blank line, Content-Length body), or None if the
    client closed (or sent something unreadable) first. Chunked request bodies are not read."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length > 0 else b""
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
        return None
    return head, body


def split_http_requests(data: bytes) -> list[tuple[bytes, bytes]]:
    """The HTTP/1.1 requests in the bytes a client sent on one connection: (head, body) each,
    bodies by ``Content-Length``; an incomplete last request keeps what arrived."""
    out: list[tuple[bytes, bytes]] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            out.append((head, b""))
            break
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
        out.append((head + sep, rest[:length]))
        data = rest[length:]
    return out
