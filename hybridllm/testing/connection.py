"""How a `FaultProxy` serves one client connection, on the proxy's asyncio event loop.

:func:`handle` is the whole life of an accepted connection: refuse it (TCP RST), answer an HTTP
fault itself (:func:`_answer`, playing :func:`hybridllm.testing.faults.canned`), or connect to
the upstream and pump bytes both ways (:func:`_pump`). Response chunks go through a bounded
queue stamped with their delivery time (latency, jitter, first-byte stalls drawn from
:meth:`ProxyState.draw`), so a steady stream is shifted rather than slowed down, and
``reset_after_bytes`` cuts the response and resets the client.

Every outcome is written to the connection's :class:`~hybridllm.testing.state.ConnectionRecord`
through the shared :class:`~hybridllm.testing.state.ProxyState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

from hybridllm.testing.faults import Faults, canned, read_request
from hybridllm.testing.state import ConnectionRecord, ProxyState

__all__ = ["handle"]

_READ_SIZE = 65536
_QUEUE_CHUNKS = 256


async def handle(
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
        await _pump(state, rec, c_reader, c_writer, u_reader, u_writer, preface)
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


async def _pump(
    state: ProxyState,
    rec: ConnectionRecord,
    c_reader: asyncio.StreamReader,
    c_writer: asyncio.StreamWriter,
    u_reader: asyncio.StreamReader,
    u_writer: asyncio.StreamWriter,
    preface: bytes = b"",
) -> None:
    """Forward bytes both ways, delaying and cutting the response side as the faults say."""
    # (deliver_at, data); None marks upstream EOF.
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
    awaiting_response = False  # the client sent bytes since the last response byte
    if preface:  # a request the proxy already read (to decide on an HTTP fault)
        awaiting_response = True
        u_writer.write(preface)

    async def client_to_upstream() -> None:
        nonlocal awaiting_response
        while True:
            try:
                data = await c_reader.read(_READ_SIZE)
            except OSError:
                data = b""
            if not data:
                state.finish(rec, "client", client_closed=True)
                return
            awaiting_response = True
            state.update(rec, bytes_up=rec.bytes_up + len(data))
            if state.record:
                state.update(rec, sent=rec.sent + data)
            u_writer.write(data)
            try:
                await u_writer.drain()
            except OSError:
                state.finish(rec, "upstream")
                return

    async def upstream_to_queue() -> None:
        nonlocal awaiting_response
        last_deliver = 0.0
        while True:
            try:
                data = await u_reader.read(_READ_SIZE)
            except OSError:
                data = b""
            now = time.monotonic()
            if not data:
                state.update(rec, upstream_closed_at=now)
                await queue.put(None)
                return
            delay = state.draw(state.faults, first=awaiting_response)
            awaiting_response = False
            last_deliver = max(last_deliver, now + delay)
            await queue.put((last_deliver, data))

    async def queue_to_client() -> None:
        while True:
            item = await queue.get()
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

    tasks = [
        asyncio.create_task(client_to_upstream()),
        asyncio.create_task(upstream_to_queue()),
        asyncio.create_task(queue_to_client()),
    ]
    try:
        # The connection ends when the client side closes, the response side finishes
        # (upstream EOF delivered, or reset), whichever comes first.
        await asyncio.wait((tasks[0], tasks[2]), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
