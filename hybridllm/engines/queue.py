"""`BoundedQueue`: one request at a time on an engine, first come first served, with bounds.

A local engine runs one generation at a time; the others wait in the order of their calls. Left
unbounded, a burst of requests waits without end (20 concurrent streams on a 2-core machine: the
last one waited 11 s for its first token). Two optional bounds, set on the engine:

- `max_queue`: at most this many requests wait (the running one not counted). One more is
  refused at once with `QueueFullError`, before it joins the queue. 0: never wait.
- `max_queue_wait_s`: a request whose expected wait (the estimates of the requests ahead of it)
  is longer is refused at once; one that has waited this long without its turn (the estimates
  were short) leaves the queue with `QueueFullError`.

`unavailable()` says the same before a request is made, so routing sends the request to the cloud
when the policy allows it (with the reason), and a request that cannot go elsewhere fails at once
with the typed error instead of waiting. The error comes before the model does any work, so the
race answers it from the other engine at once.
"""

from __future__ import annotations

import itertools
import math
import time

import anyio

from hybridllm.errors import ConfigError, QueueFullError


class BoundedQueue:
    """The queue of one engine: a FIFO lock, the estimates of the requests it holds, bounds."""

    def __init__(
        self,
        engine: str,
        *,
        max_queue: int | None = None,
        max_queue_wait_s: float | None = None,
    ) -> None:
        if max_queue is not None and (
            isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0
        ):
            raise ConfigError(f"max_queue must be an int >= 0 or None, not {max_queue!r}")
        if max_queue_wait_s is not None and (
            isinstance(max_queue_wait_s, bool)
            or not isinstance(max_queue_wait_s, int | float)
            or not math.isfinite(max_queue_wait_s)
            or max_queue_wait_s <= 0
        ):
            raise ConfigError(
                f"max_queue_wait_s must be a finite number > 0 or None, not {max_queue_wait_s!r}"
            )
        self.engine = engine
        self.max_queue = max_queue
        self.max_queue_wait_s = None if max_queue_wait_s is None else float(max_queue_wait_s)
        self.lock = anyio.Lock()  # one request at a time, FIFO
        self.pending: dict[int, float] = {}  # waiting request id -> its estimated seconds
        self.active: tuple[float, float] | None = None  # (started at, estimated seconds)
        self._ids = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self.pending)

    @property
    def depth(self) -> int:
        """Requests waiting plus the one running."""
        return self.waiting + (1 if self.active is not None or self.lock.locked() else 0)

    def expected_wait_s(self) -> float:
        """Seconds a request queued now would wait before its turn (estimate)."""
        wait = sum(self.pending.values())
        if self.active is not None:
            started, est = self.active
            wait += max(0.0, est - (time.perf_counter() - started))
        return wait

    def unavailable(self) -> str | None:
        """Why a request made now would be refused (None: it would be taken)."""
        if not self.lock.locked():
            return None  # nothing running: no wait at all
        waiting = self.waiting
        if self.max_queue is not None and waiting >= self.max_queue:
            return f"queue full ({waiting} waiting, max_queue={self.max_queue})"
        limit = self.max_queue_wait_s
        if limit is not None:
            wait = self.expected_wait_s()
            if wait > limit:
                return f"queue wait ~{wait:.1f} s > max_queue_wait_s={limit:g} s"
        return None

    def _refusal(self, why: str) -> QueueFullError:
        return QueueFullError(
            f"{self.engine} engine: {why}; refused without waiting",
            engine=self.engine,
            waiting=self.waiting,
            max_queue=self.max_queue,
            max_queue_wait_s=self.max_queue_wait_s,
        )

    def check(self) -> None:
        """Raise `QueueFullError` if a request made now would be refused."""
        why = self.unavailable()
        if why is not None:
            raise self._refusal(why)

    async def acquire(self, estimate_s: float) -> None:
        """Wait for this request's turn (FIFO), holding `estimate_s` (its expected run time) in
        the queue meanwhile. Raises `QueueFullError` at once past a bound, or after
        `max_queue_wait_s` of waiting. The caller calls `release()` after its turn."""
        self.check()
        try:
            self.lock.acquire_nowait()  # free: this request's turn now, it never waited
            return
        except anyio.WouldBlock:
            pass
        rid = next(self._ids)
        self.pending[rid] = estimate_s
        try:
            if self.max_queue_wait_s is None:
                await self.lock.acquire()
            else:
                with anyio.move_on_after(self.max_queue_wait_s):
                    await self.lock.acquire()
                    return
                del self.pending[rid]  # not waiting any more: the error counts those left
                raise QueueFullError(
                    f"{self.engine} engine: waited {self.max_queue_wait_s:g} s "
                    f"(max_queue_wait_s) without a turn; {self.waiting} still waiting",
                    engine=self.engine,
                    waiting=self.waiting,
                    max_queue=self.max_queue,
                    max_queue_wait_s=self.max_queue_wait_s,
                )
        finally:
            self.pending.pop(rid, None)

    def release(self) -> None:
        self.active = None
        self.lock.release()
