"""A loopback TCP proxy that injects network faults, for tests and benchmarks.

`tc netem` is not available everywhere, so WAN latency, jitter, stalls and resets are emulated
by a small proxy between the client under test and a real upstream server (for instance the
OpenAI-compatible server of :class:`hybridllm.testing.LlamaServer`). The proxy forwards raw
bytes, so HTTP/1.1, keep-alive and server-sent events pass through unchanged.

The proxy runs its own asyncio event loop in a daemon thread, so it works the same from a
synchronous pytest fixture and from async tests on any event loop::

    with FaultProxy(upstream=("127.0.0.1", server.port)) as proxy:
        proxy.faults = Faults(latency_ms=80, jitter_ms=20, seed=1)
        client = OpenAI(base_url=proxy.url + "/v1", api_key="x")
        ...
        proxy.wait_client_closed(timeout=2.0)   # from async code: anyio.to_thread.run_sync

Faults are read live: setting ``proxy.faults`` affects new connections (``refuse`` and the HTTP
faults), and on open connections the next response chunk (``latency_ms``, ``jitter_ms``), the
next response (``first_byte_stall_ms``) and the byte count (``reset_after_bytes``).

HTTP-level faults (``http_status``, ``sse_garbage``, ``keepalive_only_s``) make the proxy read the
first request of a connection (head and ``Content-Length`` body) and answer it itself, without
contacting the upstream, then close the connection (``Connection: close``: a client's retry
opens a new one). With ``fail_first=N`` only the first N requests (connections, for ``refuse``)
after the faults were set are answered that way; later ones reach the real server.

All timestamps are ``time.monotonic()`` values, comparable with the test's own clock.

This module holds :class:`FaultProxy` itself (public API, thread and event-loop lifecycle). The
pieces live beside it: :mod:`hybridllm.testing.faults` (:class:`Faults`, :func:`heavy_tail`, the
canned HTTP answers), :mod:`hybridllm.testing.state` (:class:`ConnectionRecord`,
:data:`ClosedBy` and the state shared with the proxy thread) and
:mod:`hybridllm.testing.connection` (serving one connection on the event loop). The names are
re-exported here, so ``from hybridllm.testing.proxy import heavy_tail`` keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from hybridllm.testing.connection import handle
from hybridllm.testing.faults import Faults, StallDist, heavy_tail, split_http_requests
from hybridllm.testing.state import ClosedBy, ConnectionRecord, ProxyState

__all__ = ["ClosedBy", "ConnectionRecord", "FaultProxy", "Faults", "StallDist", "heavy_tail"]


class FaultProxy:
    """A fault-injecting TCP proxy on ``127.0.0.1:<free port>`` in front of ``upstream``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Stopping closes every
    socket, ends the event loop and joins the thread.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        faults: Faults | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        record: bool = False,
    ) -> None:
        self._state = ProxyState(upstream, faults if faults is not None else Faults(), record)
        self._host = host
        self._requested_port = port
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def upstream(self) -> tuple[str, int]:
        """The ``(host, port)`` connections are forwarded to (read at each upstream connect)."""
        return self._state.upstream

    @upstream.setter
    def upstream(self, upstream: tuple[str, int]) -> None:
        self._state.upstream = upstream

    @property
    def record(self) -> bool:
        """Keep every byte clients send (``requests()``); read live."""
        return self._state.record

    @record.setter
    def record(self, record: bool) -> None:
        self._state.record = record

    @property
    def faults(self) -> Faults:
        return self._state.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self._state.faults = faults  # reseeds the RNG and restarts the ``fail_first`` count

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FaultProxy is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (append ``/v1`` for an OpenAI-compatible base URL)."""
        return f"http://{self._host}:{self.port}"

    @property
    def connections(self) -> list[ConnectionRecord]:
        """Copies of the records of all connections accepted so far, oldest first."""
        return self._state.snapshot()

    def requests(self) -> list[tuple[bytes, bytes]]:
        """(head, body) of every HTTP request clients sent through the proxy while it recorded
        (``record=True``), oldest connection first: what reached the network."""
        return [r for rec in self.connections for r in split_http_requests(rec.sent)]

    def wait_client_closed(self, conn_id: int | None = None, timeout: float = 5.0) -> float | None:
        """Block until the client side of a connection closed; return when (monotonic) or None.

        ``conn_id=None`` means the most recent connection (waiting for one to be accepted if
        there is none yet). Returns None on timeout, or when the connection ended without the
        client closing it (upstream close, reset, proxy stop).
        """
        return self._state.wait_client_closed(conn_id, timeout)

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        self._ready.clear()
        self._thread = threading.Thread(
            target=self._thread_main, name=f"FaultProxy->{self.upstream[0]}:{self.upstream[1]}"
        )
        self._thread.daemon = True
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError("FaultProxy failed to start") from self._startup_error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("FaultProxy thread did not stop in time")
        self._thread = None
        self._loop = None
        self._stop_event = None
        self._port = None

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
        where = f"port={self._port}" if self._port is not None else "not started"
        return f"<FaultProxy {where} -> {self.upstream[0]}:{self.upstream[1]} {self.faults}>"

    # -- the proxy thread -------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by start() if it happened during startup
            self._startup_error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await handle(self._state, reader, writer)
            except asyncio.CancelledError:
                pass  # stop() cancels handlers; asyncio's stream callback logs a cancelled task
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(on_accept, self._host, self._requested_port)
        self._port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            server.close()
            for task in list(handlers):
                task.cancel()
            if handlers:
                await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()
