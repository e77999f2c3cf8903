"""What a `FaultProxy` knows, shared between the caller's thread and the proxy's event loop.

:class:`ConnectionRecord` describes one accepted client connection and :data:`ClosedBy` says who
ended it. :class:`ProxyState` holds the live settings (upstream address, ``record``, the current
:class:`~hybridllm.testing.faults.Faults` with their seeded RNG and ``fail_first`` count) and the
connection records, all guarded by one condition variable: the proxy thread updates records and
draws delays under it, and the caller's thread takes snapshots and waits on it
(:meth:`ProxyState.wait_client_closed`).

All timestamps are ``time.monotonic()`` values, comparable with the test's own clock.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass
from typing import Literal

from hybridllm.testing.faults import Faults

__all__ = ["ClosedBy", "ConnectionRecord", "ProxyState"]

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
    :mod:`hybridllm.testing.proxy` docstring for when a change takes effect).
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
