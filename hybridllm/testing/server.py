"""A real OpenAI-compatible server (``llama_cpp.server``) on loopback, for integration tests.

::

    with LlamaServer("/path/model.gguf", alias="cloud", api_key="sk-test") as server:
        client = OpenAI(base_url=server.base_url, api_key=server.api_key)
        client.chat.completions.create(model=server.model, messages=[...])

The server runs as a subprocess of ``sys.executable`` (so the same virtual environment must
have ``llama-cpp-python[server]`` installed) on a free port of 127.0.0.1. Its stdout and stderr
go to a log file (never a pipe that could fill up and block it); a start that fails raises
:class:`ServerStartError` with the last lines of that log.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

from hybridllm.errors import ServerStartError
from hybridllm.local import waitpolicy

__all__ = ["LlamaServer", "ServerStartError"]


if TYPE_CHECKING:  # finalize is generic only in typeshed
    _Finalizer = weakref.finalize[[subprocess.Popen[bytes], float], "LlamaServer"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick; racy but fine here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Terminate, wait, kill after ``timeout``, and reap (no zombie)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


class LlamaServer:
    """Runs ``python -m llama_cpp.server`` for one GGUF model on ``127.0.0.1:<port>``.

    (`HybridServer` runs hybridllm's own server the same way.)

    ``alias`` is the model name clients send (``.model``); ``api_key``, when set, makes the
    server demand ``Authorization: Bearer <api_key>``. ``extra_args`` are appended to the
    command line (e.g. ``["--n_batch", "512"]``). ``log_path``: where the server's output goes;
    by default a temporary file that is deleted on :meth:`stop` (kept when the start failed).
    """

    label = "llama_cpp.server"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        alias: str = "local",
        n_ctx: int = 2048,
        api_key: str | None = None,
        n_threads: int | None = None,
        port: int | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.model = alias
        self.n_ctx = n_ctx
        self.api_key = api_key
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args)
        self.env = env
        self._requested_port = port
        self._port: int | None = None
        self._user_log = Path(log_path) if log_path is not None else None
        self.log_path: Path | None = None
        self._log_file: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: _Finalizer | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LlamaServer is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the root; see :attr:`base_url` for the API)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the OpenAI-compatible base URL."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self, port: int) -> list[str]:
        """The command line used to start the server on ``port``."""
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
            "--model_alias",
            self.model,
        ]
        if self.api_key is not None:
            cmd += ["--api_key", self.api_key]
        if self.n_threads is not None:
            cmd += ["--n_threads", str(self.n_threads)]
        return cmd + self.extra_args

    def start(self) -> Self:
        if self._proc is not None:
            raise RuntimeError("LlamaServer already started")
        if not self.model_path.is_file():
            raise FileNotFoundError(f"model file not found: {self.model_path}")
        port = self._requested_port if self._requested_port is not None else free_port()
        if self._user_log is not None:
            self.log_path = self._user_log
            self._log_file = open(self._user_log, "wb")  # closed in stop()
        else:
            fd, name = tempfile.mkstemp(prefix="hybridllm-llama-server-", suffix=".log")
            self.log_path = Path(name)
            self._log_file = os.fdopen(fd, "wb")
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # a server on this machine shares its cores with the app's own engine: its threads sleep
        # at once when they wait, unless the environment says otherwise (see waitpolicy)
        env.setdefault(waitpolicy.ENV, "PASSIVE")
        self._proc = subprocess.Popen(
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        # Reap the server even if the caller forgets stop() (finalizer runs at exit too).
        self._finalizer = weakref.finalize(self, _kill, self._proc, self.stop_timeout)
        self._port = port
        try:
            self._wait_ready()
        except BaseException:
            self._shutdown(keep_log=True)
            raise
        return self

    def stop(self) -> None:
        """Stop the server (terminate, then kill after ``stop_timeout``) and clean up."""
        self._shutdown(keep_log=self._user_log is not None)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's output so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_bytes()[-65536:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._port}" if self._proc is not None else "stopped"
        return f"<{type(self).__name__} {self.model!r} {self.model_path.name} {state}>"

    # -- internals --------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        assert self._proc is not None
        url = f"{self.base_url}/models"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.label} exited with code {code} during startup "
                    f"(log: {self.log_path}); last lines:\n{self.log_tail()}"
                )
            try:
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, timeout=2.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or still loading the model
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.label} did not answer GET {url} within {self.startup_timeout}s "
                    f"(log: {self.log_path}); last lines:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _shutdown(self, *, keep_log: bool) -> None:
        if self._finalizer is not None:
            self._finalizer()  # terminates and reaps the process, once
            self._finalizer = None
        self._proc = None
        self._port = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if not keep_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None
