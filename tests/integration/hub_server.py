"""A loopback server that speaks what `huggingface_hub` calls under `HF_ENDPOINT`.

The hub's download API as huggingface_hub 2.x uses it (read from its `file_download.py`,
`hf_api.list_repo_tree` and `utils/_http.hf_raise_for_status`):
- `GET /api/models/{owner}/{name}/tree/{revision}?recursive=...`: the file listing, LFS files
  with `lfs: {oid: sha256, size, pointerSize}`;
- `HEAD` / `GET /{owner}/{name}/resolve/{revision}/{path}`: `X-Repo-Commit`, `ETag` and
  `X-Linked-Etag` (the LFS sha256), `X-Linked-Size`; `Range: bytes=N-` answered 206;
- errors as the hub sends them: `X-Error-Code` `RepoNotFound` (404), `EntryNotFound` (404),
  `GatedRepo` (401, unless `Authorization: Bearer <token>` names the repository's token).

Faults for the tests: `cut_at` (the next download sends that many bytes, then drops the
connection; with `down_after_cut` the hub then stays down), `down` (every download answers
503), `corrupt` (paths served with one byte changed,
the listing and headers still announcing the true sha256).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.loopback import POLL_S

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, Path]  # path in the repository -> the bytes served
    gated_token: str | None = None  # gated: only this token may download
    sha: dict[str, str] = field(default_factory=dict)


@dataclass
class HubState:
    repos: dict[str, Repo]
    cut_at: int | None = None
    down: bool = False
    down_after_cut: bool = False  # the cut also takes the hub down (until `down` is cleared)
    corrupt: set[str] = field(default_factory=set)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range)

    def sha256(self, repo: Repo, path: str) -> str:
        if path not in repo.sha:
            h = hashlib.sha256()
            with repo.files[path].open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            repo.sha[path] = h.hexdigest()
        return repo.sha[path]


class _Handler(BaseHTTPRequestHandler):
    state: HubState
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        self.state.log.append((self.command, url.path, self.headers.get("Range", "")))
        if parts[:2] == ["api", "models"] and len(parts) >= 5 and parts[4] == "tree":
            return self._tree(f"{parts[2]}/{parts[3]}")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), body)
        self._error(404, "EntryNotFound", "no such route")

    def _tree(self, repo_id: str) -> None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        entries = []
        for path, file in repo.files.items():
            size = file.stat().st_size
            sha = self.state.sha256(repo, path)
            lfs = {"oid": sha, "size": size, "pointerSize": 134}
            entry = {"type": "file", "oid": sha[:40], "size": size, "path": path, "lfs": lfs}
            entries.append(entry)
        data = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _resolve(self, repo_id: str, path: str, body: bool) -> None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self._error(401, "GatedRepo", "Access to model is restricted")
        if path not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found")
        if body and self.state.down:
            return self._error(503, "", "Service unavailable")
        file = repo.files[path]
        size = file.stat().st_size
        start = _range_start(self.headers.get("Range", ""))
        sha = self.state.sha256(repo, path)
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if body:
            self._body(file, path, start)

    def _body(self, file: Path, path: str, start: int) -> None:
        cut, self.state.cut_at = self.state.cut_at, None
        sent = start
        with file.open("rb") as fh:
            fh.seek(start)
            for block in iter(lambda: fh.read(1 << 20), b""):
                if path in self.state.corrupt and sent == 0:  # one byte of the header changed
                    block = block[:100] + bytes([block[100] ^ 0xFF]) + block[101:]
                if cut is not None and sent + len(block) > cut:
                    self.state.down = self.state.down or self.state.down_after_cut
                    self.wfile.write(block[: cut - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-body
                    return
                self.wfile.write(block)
                sent += len(block)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _range_start(header: str) -> int:
    if not header.startswith("bytes="):
        return 0
    first = header.removeprefix("bytes=").split("-")[0]
    return int(first) if first.isdigit() else 0


@contextmanager
def hub_server(repos: dict[str, Repo]) -> Iterator[tuple[str, HubState]]:
    """A running loopback hub: (its endpoint URL, its state to script faults and read the log)."""
    state = HubState(repos)
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
