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

Inside: :class:`ProxyState` holds what the caller's thread and the proxy's event loop share (the
live settings, the seeded fault RNG, the ``fail_first`` count and the :class:`ConnectionRecord`
of every connection) under one condition variable. :func:`_handle_connection` is the whole life
of an accepted connection: refuse it (TCP RST), answer an HTTP fault itself (:func:`_answer`,
playing :func:`hybridllm.testing.faults.canned`), or connect to the upstream and pump bytes both
ways (:class:`_Pump`). Response chunks go through a bounded queue stamped with their delivery
time (latency, jitter, first-byte stalls drawn from :meth:`ProxyState.draw`), so a steady stream
is shifted rather than slowed down, and ``reset_after_bytes`` cuts the response and resets the
client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from hybridllm.testing.faults import (
    Faults,
    StallDist,
    canned,
    heavy_tail,
    read_request,
    split_http_requests,
)

__all__ = ["ClosedBy", "ConnectionRecord", "FaultProxy", "Faults", "StallDist", "heavy_tail"]

ClosedBy = Literal["client", "upstream", "proxy-reset", "proxy", "proxy-answer"]
"""Who ended a proxied connection.

``"client"``: the client closed or reset its side (the upstream connection is then closed too).
``"upstream"``: the upstream closed, or could not be reached.
``"proxy-reset"``: a fault (``refuse`` or ``reset_after_bytes``) sent a TCP RST to the client.
``"proxy"``: the proxy was stopped with the connection still open.
``"proxy-answer"``: an HTTP fault answered the request and the proxy closed the connection.
"""


@dataclass(slots=True)
class ConnectionRecord:
    """What happened on one accepted client connection (a snapshot; times are monotonic)."""

    id: int
    opened_at: float
    refused: bool = False
    closed_by: ClosedBy | None = None
    closed_at: float | None = None
    client_closed_at: float | None = None
    """When the proxy saw the client side close (EOF or reset); None if the proxy closed it."""
    upstream_closed_at: float | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    first_byte_down_at: float | None = None
    error: str | None = None
    http_fault: str | None = None
    """The HTTP fault the proxy answered this connection's request with (``Faults.http_fault``)."""
    request_head: bytes | None = None
    """The request line and headers, when an HTTP fault made the proxy read them."""
    sent: bytes = b""
    """Every byte the client sent on this connection, when the proxy records (``record=True``)."""


class ProxyState:
    """Thread-safe settings, fault RNG and connection records of one proxy.

    ``upstream``, ``record`` and ``faults`` are read live by the proxy's connections (see the
    module docstring for when a change takes effect).
    """

    def __init__(self, upstream: tuple[str, int], faults: Faults, record: bool) -> None:
        self.upstream = upstream
        self.record = record  # keep every byte clients send (``FaultProxy.requests()``)
        self._faults = faults
        self._rng = random.Random(faults.seed)
        self._failed = 0  # connections/requests that got refuse or an HTTP fault (fail_first)
        self._records: list[ConnectionRecord] = []
        self._cond = threading.Condition()

    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        with self._cond:
            self._faults = faults
            self._rng = random.Random(faults.seed)
            self._failed = 0

    # -- caller's side ----------------------------------------------------------------------

    def snapshot(self) -> list[ConnectionRecord]:
        """Copies of all records, oldest first."""
        with self._cond:
            return [dataclasses.replace(r) for r in self._records]

    def wait_client_closed(self, conn_id: int | None, timeout: float) -> float | None:
        """See :meth:`hybridllm.testing.FaultProxy.wait_client_closed`."""
        deadline = time.monotonic() + timeout

        def done() -> bool:
            rec = self._find(conn_id)
            return rec is not None and rec.closed_at is not None

        with self._cond:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            rec = self._find(conn_id)
            assert rec is not None
            return rec.client_closed_at

    def _find(self, conn_id: int | None) -> ConnectionRecord | None:
        if conn_id is None:
            return self._records[-1] if self._records else None
        for rec in self._records:
            if rec.id == conn_id:
                return rec
        return None

    # -- proxy thread's side ----------------------------------------------------------------

    def open_record(self) -> ConnectionRecord:
        """Add the record of a newly accepted connection."""
        with self._cond:
            rec = ConnectionRecord(id=len(self._records) + 1, opened_at=time.monotonic())
            self._records.append(rec)
            self._cond.notify_all()
        return rec

    def update(self, rec: ConnectionRecord, **changes: object) -> None:
        with self._cond:
            for key, value in changes.items():
                setattr(rec, key, value)
            self._cond.notify_all()

    def add_bytes_down(self, rec: ConnectionRecord, count: int) -> None:
        """Count response bytes handed to the client (the first one sets ``first_byte_down_at``)."""
        now = time.monotonic()
        with self._cond:
            if rec.first_byte_down_at is None:
                rec.first_byte_down_at = now
            rec.bytes_down += count
            self._cond.notify_all()

    def finish(self, rec: ConnectionRecord, by: ClosedBy, *, client_closed: bool = False) -> None:
        """Mark the connection ended; the first caller decides ``closed_by``."""
        now = time.monotonic()
        with self._cond:
            if rec.closed_by is None:
                rec.closed_by = by
                rec.closed_at = now
                if client_closed:
                    rec.client_closed_at = now
            self._cond.notify_all()

    def draw(self, faults: Faults, first: bool) -> float:
        """Seconds to delay a chunk: latency, a jitter draw and, for the first chunk of a
        response, a stall draw (all from the seeded RNG)."""
        with self._cond:
            delay = faults.latency_ms
            if faults.jitter_ms > 0:
                delay += self._rng.uniform(0.0, faults.jitter_ms)
            if first and (faults.first_byte_stall_ms > 0 or faults.first_byte_stall_dist):
                p = faults.stall_probability
                if p >= 1.0 or self._rng.random() < p:
                    dist = faults.first_byte_stall_dist
                    delay += max(0.0, dist(self._rng)) if dist else faults.first_byte_stall_ms
        return delay / 1000.0

    def take_failure(self, faults: Faults) -> bool:
        """Whether this connection/request gets the fault (``fail_first`` not used up)."""
        with self._cond:
            if faults is not self._faults:  # changed meanwhile: the new faults decide next time
                return False
            if faults.fail_first is not None and self._failed >= faults.fail_first:
                return False
            self._failed += 1
            return True


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
                await _handle_connection(self._state, reader, writer)
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


# -- serving one connection, on the proxy's event loop ----------------------------------------

_READ_SIZE = 65536
_QUEUE_CHUNKS = 256


async def _handle_connection(
    state: ProxyState, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter
) -> None:
    """Serve one accepted client connection until it ends; close both sides."""
    faults = state.faults
    rec = state.open_record()
    u_writer: asyncio.StreamWriter | None = None
    try:
        if faults.refuse and state.take_failure(faults):
            state.update(rec, refused=True)
            state.finish(rec, "proxy-reset")
            _reset(c_writer)
            return
        preface = b""
        if faults.http_fault is not None:
            request = await read_request(c_reader)
            if request is None:  # the client left (or sent no HTTP) before a full request
                state.finish(rec, "client", client_closed=True)
                return
            head, body = request
            state.update(
                rec,
                request_head=head,
                bytes_up=len(head) + len(body),
                sent=head + body if state.record else b"",
            )
            if state.take_failure(faults):
                state.update(rec, http_fault=faults.http_fault)
                await _answer(state, rec, faults, c_reader, c_writer)
                return
            preface = head + body
        try:
            u_reader, u_writer = await asyncio.open_connection(*state.upstream)
        except OSError as exc:
            state.update(rec, error=f"upstream connect failed: {exc!r}")
            state.finish(rec, "upstream")
            _reset(c_writer)
            return
        await _Pump(state, rec, (c_reader, c_writer), (u_reader, u_writer)).run(preface)
    except asyncio.CancelledError:
        state.finish(rec, "proxy")
        raise
    finally:
        _close(c_writer)
        if u_writer is not None:
            _close(u_writer)
        with contextlib.suppress(Exception):
            await c_writer.wait_closed()
        if u_writer is not None:
            with contextlib.suppress(Exception):
                await u_writer.wait_closed()
        if rec.closed_by is None:  # should not happen; keep records consistent
            state.finish(rec, "proxy")


class _Pump:
    """Forwards bytes both ways on one connection, delaying and cutting the response side as
    the faults say: client -> upstream, upstream -> a queue stamped with delivery times, and
    that queue -> the client."""

    def __init__(
        self,
        state: ProxyState,
        rec: ConnectionRecord,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.state, self.rec = state, rec
        self.c_reader, self.c_writer = client
        self.u_reader, self.u_writer = upstream
        # (deliver_at, data); None marks upstream EOF.
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
        self.awaiting_response = False  # the client sent bytes since the last response byte

    async def run(self, preface: bytes = b"") -> None:
        if preface:  # a request the proxy already read (to decide on an HTTP fault)
            self.awaiting_response = True
            self.u_writer.write(preface)
        tasks = [
            asyncio.create_task(self.client_to_upstream()),
            asyncio.create_task(self.upstream_to_queue()),
            asyncio.create_task(self.queue_to_client()),
        ]
        try:
            # The connection ends when the client side closes, the response side finishes
            # (upstream EOF delivered, or reset), whichever comes first.
            await asyncio.wait((tasks[0], tasks[2]), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def client_to_upstream(self) -> None:
        state, rec = self.state, self.rec
        while True:
            try:
                data = await self.c_reader.read(_READ_SIZE)
            except OSError:
                data = b""
            if not data:
                state.finish(rec, "client", client_closed=True)
                return
            self.awaiting_response = True
            state.update(rec, bytes_up=rec.bytes_up + len(data))
            if state.record:
                state.update(rec, sent=rec.sent + data)
            self.u_writer.write(data)
            try:
                await self.u_writer.drain()
            except OSError:
                state.finish(rec, "upstream")
                return

    async def upstream_to_queue(self) -> None:
        last_deliver = 0.0
        while True:
            try:
                data = await self.u_reader.read(_READ_SIZE)
            except OSError:
                data = b""
            now = time.monotonic()
            if not data:
                self.state.update(self.rec, upstream_closed_at=now)
                await self.queue.put(None)
                return
            delay = self.state.draw(self.state.faults, first=self.awaiting_response)
            self.awaiting_response = False
            last_deliver = max(last_deliver, now + delay)
            await self.queue.put((last_deliver, data))

    async def queue_to_client(self) -> None:
        state, rec, c_writer = self.state, self.rec, self.c_writer
        while True:
            item = await self.queue.get()
            if item is None:
                state.finish(rec, "upstream")
                return
            deliver_at, data = item
            wait = deliver_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            limit = state.faults.reset_after_bytes
            if limit is not None and rec.bytes_down + len(data) >= limit:
                data = data[: max(0, limit - rec.bytes_down)]
                if data:
                    await _send(state, rec, c_writer, data)
                await _flush(c_writer)
                state.finish(rec, "proxy-reset")
                _reset(c_writer)
                return
            if not await _deliver(state, rec, c_writer, data):
                return


async def _answer(
    state: ProxyState,
    rec: ConnectionRecord,
    faults: Faults,
    c_reader: asyncio.StreamReader,
    c_writer: asyncio.StreamWriter,
) -> None:
    """Play the canned response of an HTTP fault, stopping early if the client leaves."""
    watcher = asyncio.create_task(_until_eof(c_reader))
    try:
        wait = state.draw(faults, first=True)
        for pause, data in canned(faults):
            wait += pause
            if wait > 0:
                await asyncio.wait((watcher,), timeout=wait)
            wait = 0.0
            if watcher.done():
                state.finish(rec, "client", client_closed=True)
                return
            if not await _deliver(state, rec, c_writer, data):
                return
        await _flush(c_writer)
        state.finish(rec, "proxy-answer")
    finally:
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher


async def _deliver(
    state: ProxyState, rec: ConnectionRecord, writer: asyncio.StreamWriter, data: bytes
) -> bool:
    """Send to the client; False (and the connection recorded as client-closed) if it left."""
    try:
        await _send(state, rec, writer, data)
    except OSError:
        state.finish(rec, "client", client_closed=True)
        return False
    return True


async def _send(
    state: ProxyState, rec: ConnectionRecord, writer: asyncio.StreamWriter, data: bytes
) -> None:
    writer.write(data)
    state.add_bytes_down(rec, len(data))
    await writer.drain()


async def _until_eof(reader: asyncio.StreamReader) -> None:
    """Read (and drop) until the client closes its side."""
    with contextlib.suppress(OSError):
        while await reader.read(_READ_SIZE):
            pass


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


async def _flush(writer: asyncio.StreamWriter) -> None:
    """Wait until asyncio handed every buffered byte to the kernel (best effort, 2 s at most)."""
    with contextlib.suppress(Exception):
        writer.transport.set_write_buffer_limits(high=0)  # drain() now waits for an empty buffer
        async with asyncio.timeout(2.0):
            await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0, so the peer gets a TCP RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
