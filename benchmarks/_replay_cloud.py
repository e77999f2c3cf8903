"""A cloud whose model runs elsewhere: an OpenAI-compatible endpoint that replays recorded
streams at their recorded pace, for benchmarks where several clouds and the device would
otherwise share this machine's two cores (`bench_engines.py --clouds replay`).

    python benchmarks/_replay_cloud.py --upstream http://127.0.0.1:PORT --recording FILE
        [--port 0]

It writes "port N" once it listens. A streamed chat completion whose request matches a recorded
one (the same messages, token bound, tools and response format; see `request_key`) is answered
with the recorded SSE bytes, each chunk at its recorded offset from the request's arrival: the
recorded model's own TTFT and pace, with none of its compute here, as with a real provider.
Anything else (a request never recorded, a continuation, a model listing) goes to the upstream
server live and is counted: `GET /replay/stats` says how many requests were replayed and how
many went live, so a run can say how much of it was replay.

Faults are the endpoint's own, per request (not per connection, so a client's connection pool
changes nothing): `POST /replay/fault {"status": 500}` answers every chat request with that
status until set again, `{"delay_ms": D}` holds each one's first byte (and the rest after it) D
ms, `{}` clears.

A recording is a JSON list of {"key": ..., "status": 200, "chunks": [[offset_s, text], ...]},
made by `record()` against the real upstream with nothing else running on its core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

# fields that change how a request is carried or billed, not what the model writes
CARRIAGE = frozenset(
    {"model", "stream", "stream_options", "user", "prompt_cache_key", "metadata", "store", "n"}
)


def request_key(body: dict[str, Any]) -> str:
    """What decides a streamed answer's text: every field but the carriage ones, the token
    bound under one name, no nucleus bounds under greedy decoding, and messages as role and
    content only."""
    kept = {k: v for k, v in body.items() if k not in CARRIAGE}
    if "max_completion_tokens" in kept:
        kept["max_tokens"] = kept.pop("max_completion_tokens")
    kept.setdefault("temperature", 0.0)
    kept["temperature"] = float(kept["temperature"] or 0.0)
    if kept["temperature"] == 0.0:  # greedy: the nucleus bounds choose nothing
        for name in ("top_p", "top_k", "min_p"):
            kept.pop(name, None)
    kept["messages"] = [
        {"role": m.get("role"), "content": m.get("content")} for m in body.get("messages", [])
    ]
    return json.dumps(kept, sort_keys=True)


async def record(upstream: str, key: str, bodies: Iterable[dict[str, Any]]) -> list[dict]:
    """Each body streamed once from the real upstream, one at a time: its chunks and their
    offsets from the request's send."""
    import httpx

    out = []
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=upstream, timeout=120.0, headers=headers) as http:
        for body in bodies:
            body = {**body, "stream": True}
            t0 = time.perf_counter()
            chunks: list[list[Any]] = []
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for text in resp.aiter_text():
                    chunks.append([time.perf_counter() - t0, text])
            out.append({"key": request_key(body), "status": resp.status_code, "chunks": chunks})
    return out


def make_app(upstream: str, recording: list[dict[str, Any]]) -> Any:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    table = {r["key"]: r for r in recording if r["status"] == 200}
    counts = {"replayed": 0, "live": 0, "failed": 0}
    fault: dict[str, float] = {}  # every chat request's, until set again (`POST /replay/fault`)
    missed: list[str] = []  # the last chat requests that went live, as keys
    http = httpx.AsyncClient(base_url=upstream, timeout=300.0)

    async def replay(chunks: list[list[Any]], t0: float) -> AsyncIterator[str]:
        for offset, text in chunks:
            wait = t0 + offset - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            yield text

    async def live(request: Request, raw: bytes) -> Response:
        counts["live"] += 1
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        req = http.build_request(
            request.method, request.url.path, params=request.query_params, headers=headers,
            content=raw,
        )  # fmt: skip
        resp = await http.send(req, stream=True)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for part in resp.aiter_raw():
                    yield part
            finally:
                await resp.aclose()

        kept = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type",)}
        return StreamingResponse(body(), status_code=resp.status_code, headers=kept)

    async def chat(request: Request) -> Response:
        t0 = time.perf_counter()
        raw = await request.body()
        body = json.loads(raw or b"{}")
        if fault.get("status"):
            counts["failed"] += 1
            error = {"message": "injected failure", "type": "server_error", "code": None}
            return JSONResponse({"error": error}, status_code=fault["status"])
        t0 += fault.get("delay_ms", 0.0) / 1e3  # the first byte held, every chunk after it too
        rec = table.get(request_key(body)) if body.get("stream") else None
        if rec is None:
            missed.append(request_key(body))
            del missed[:-8]
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))  # the fault's delay
            return await live(request, raw)
        counts["replayed"] += 1
        return StreamingResponse(replay(rec["chunks"], t0), media_type="text/event-stream")

    async def other(request: Request) -> Response:
        return await live(request, await request.body())

    async def set_fault(request: Request) -> Response:
        fault.clear()
        fault.update(await request.json())
        return JSONResponse(fault)

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {**counts, "missed": missed} if request.query_params.get("missed") else counts
        )

    routes = [
        Route("/replay/stats", stats),
        Route("/replay/fault", set_fault, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/{path:path}", other, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes)


def main() -> None:
    import socket

    import uvicorn

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--recording", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    app = make_app(args.upstream, json.loads(Path(args.recording).read_text()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    print(f"port {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
