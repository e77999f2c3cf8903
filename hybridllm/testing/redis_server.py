"""A real `redis-server` on loopback, for tests and benchmarks of the Redis ledger.

::

    with RedisServer() as server:                 # a free port of 127.0.0.1, a temp dir
        ledger = RedisLedger(server.url)          # "redis://127.0.0.1:<port>/0"

The server is the system's `redis-server` binary (Debian: `apt-get install redis-server`), run
as a child process with nothing saved to disk, protected mode on and only loopback bound; its
output goes to a log file in its temporary directory, whose last lines a failed start raises
with (`ServerStartError`). `find_redis_server()` says whether the binary is there.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from hybridllm.errors import ServerStartError
from hybridllm.testing.server import free_port

__all__ = ["RedisServer", "find_redis_server"]


def find_redis_server() -> str | None:
    """The path of the `redis-server` binary on PATH (or in /usr/bin), None when missing."""
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin:/usr/bin")


def _pong(port: int) -> bool:
    """Does a Redis server answer PING on 127.0.0.1:`port`?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """`redis-server` on 127.0.0.1:`port` (default: a free one), with its working directory in
    a temporary directory removed on `stop()`. `binary`: the path of redis-server (default:
    `find_redis_server()`)."""

    def __init__(self, *, port: int | None = None, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or free_port()
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it and wait until it answers PING (`ServerStartError` when it does not)."""
        if self.binary is None:
            raise ServerStartError("redis-server is not installed (apt-get install redis-server)")
        self._dir = tempfile.TemporaryDirectory(prefix="hybridllm-redis-")
        work = Path(self._dir.name)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(work)]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
        args += ["--logfile", str(work / "redis.log")]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not _pong(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = work / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                self.stop()
                raise ServerStartError(f"redis-server did not start on port {self.port}: {tail}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Terminate it (kill after 5 s), reap it and remove its directory."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
