"""A loopback chat-completions endpoint for the cloud engine's unit tests: it plays a list of
`chat.completion.chunk`s (OpenAI's documented stream shape) as server-sent events and keeps
every request body it received. Not a model server: the real one is `hybridllm serve-model`
(tests/integration)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.loopback import POLL_S


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One `chat.completion.chunk` as OpenAI streams it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


OK = [chunk({"content": "ok"}), chunk({}, "stop")]  # a one-word answer


class Endpoint:
    """Plays `self.chunks` (default: the answer "ok") to every POST; `bodies` are the requests
    received, parsed. `url` is the API root to give `OpenAIEngine(base_url=...)`."""

    def __init__(self, chunks: list[dict[str, Any]] | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.chunks: list[dict[str, Any]] = list(OK if chunks is None else chunks)
        # answers by request: the chunks for a body, a whole JSON answer (a dict: for a request
        # that does not stream), or a status to refuse it with (None: `chunks`)
        self.answer: Callable[[dict[str, Any]], Any] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length", 0))
                request = json.loads(self.rfile.read(length))
                outer.bodies.append(request)
                chunks = outer.chunks if outer.answer is None else outer.answer(request)
                if isinstance(chunks, int):  # refused, in OpenAI's error shape
                    self.refuse(chunks)
                    return
                if isinstance(chunks, dict):
                    self.whole(chunks)
                    return
                body = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
                body += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def whole(self, answer: dict[str, Any]) -> None:
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def refuse(self, status: int) -> None:
                error = {"error": {"message": "unknown field", "type": "invalid_request_error"}}
                body = json.dumps(error).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def serving(endpoint: Endpoint) -> Iterator[Endpoint]:
    """Run `endpoint` on a thread for the duration of a fixture."""
    thread = threading.Thread(target=endpoint.server.serve_forever, args=(POLL_S,), daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        endpoint.server.shutdown()
        endpoint.server.server_close()
        thread.join(5)
