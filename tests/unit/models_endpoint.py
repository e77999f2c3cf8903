"""An OpenAI-compatible endpoint's `GET /v1/models` on loopback, for the tests that check a
cloud endpoint (`hybridllm doctor`, `OpenAIEngine.check()`): the `endpoint` fixture
(tests/unit/conftest.py) serves `Models`, answering its `status`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

from tests.loopback import POLL_S
from tests.unit.sse_endpoint import chunk


class Models(BaseHTTPRequestHandler):
    """`GET /v1/models` listing the model "smol", or answering `status` (a 401, a 403); and a
    chat completion that continues the continuation probe's count in vLLM's dialect."""

    status = 200
    entry: dict[str, object] = {}  # more fields of the model's entry (vLLM's max_model_len)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        ok = self.status == 200 and self.path == "/v1/models"
        listing = {"object": "list", "data": [{"id": "smol", "object": "model", **self.entry}]}
        body = json.dumps(listing if ok else {"error": "no"}).encode()
        self.send_response(self.status if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        """A chat completion, streamed, as a vLLM endpoint answers the continuation probe: the
        count goes on ("6, 7") under `continue_final_message`, else starts again."""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        text = " 6, 7" if body.get("continue_final_message") else "1, 2, 3"
        events = [chunk({"content": text}), chunk({}, "stop")]
        out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        out += b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_models() -> Iterator[tuple[str, type[Models]]]:
    """The endpoint's base URL and its handler class (set `status` on it), for a with block."""
    handler = type("Handler", (Models,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", handler
    finally:
        server.shutdown()
        server.server_close()
