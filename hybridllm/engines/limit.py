"""`ConcurrencyLimit`: at most `max_concurrency` requests in flight to one cloud endpoint.

Providers cap concurrent requests per key (and answer 429 past it); a self-hosted server slows
every stream down when too many run at once. `OpenAIEngine(max_concurrency=4,
queue_timeout_s=2.0)` holds the fifth request in a queue until a slot frees, by priority class
then arrival (`engines.queue.RANK`), for at most `queue_timeout_s`; past that it fails with
`CloudQueueTimeoutError` (nothing sent, so the race answers from the local engine at once).

A 429 with Retry-After closes every slot until that time (`note_retry_after`): new requests wait
for it in the queue rather than hammering the endpoint. Without a limit (`max_concurrency=None`)
nothing waits, but the Retry-After still shows in `expected_wait_s()`, so routing sees it.

`expected_wait_s()` is the queue's forecast for a request made now: the Retry-After left, or,
with every slot taken, when its slot frees. A request holds a slot `hold_s` (an exponential
average of the requests seen), so a holder that has run `e` seconds frees its slot in
`hold_s - e` (0 once it has run longer than the average: it is taken to finish now); the
requests ahead take the slots in the order they free, each for `hold_s`. The requests ahead
include those routed here a moment ago that have not reached the queue yet (`expect()`, called
by routing when it sends a request here): a burst decided at once sees itself, not an empty
queue. Routing reads the forecast from `EngineInfo.expected_wait_s` and adds it to the cloud's
predicted first-token time; a request that would miss its deadline in the queue goes to the
local engine with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

from hybridllm.clock import now
from hybridllm.engines import validate
from hybridllm.engines.queue import RANK
from hybridllm.errors import CloudQueueTimeoutError
from hybridllm.events import Priority

# a request announced by `expect()` reaches the queue within this, or is no longer counted
EXPECT_S = 1.0


class ConcurrencyLimit:
    def __init__(
        self,
        engine: str,
        max_concurrency: int | None,
        queue_timeout_s: float | None = None,
        *,
        clock: Callable[[], float] = now,
    ) -> None:
        if max_concurrency is not None:
            validate.integer("max_concurrency", max_concurrency, minimum=1)
        if queue_timeout_s is not None:
            validate.number("queue_timeout_s", queue_timeout_s, above=0.0)
        self.engine = engine
        self.max_concurrency = max_concurrency
        self.queue_timeout_s = queue_timeout_s
        self.clock = clock
        self.in_flight = 0
        self.blocked_until = 0.0  # a 429's Retry-After: no request leaves before this
        self.hold_s: float | None = None  # how long a request holds a slot (average)
        self._since: list[float] = []  # when each request in flight took its slot
        self._expected: list[tuple[float, int]] = []  # (when, class rank) routed, not yet here
        self._waiters: dict[int, tuple[int, anyio.Event]] = {}  # seq -> (rank, wake-up)
        self._seq = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _free(self) -> bool:
        cap = self.max_concurrency
        if cap is None:
            return True  # no limit: a Retry-After only informs routing
        return self.in_flight < cap and self.clock() >= self.blocked_until

    def expected_wait_s(self, priority: Priority | None = None) -> float:
        """Seconds a request made now would wait for a slot (a forecast)."""
        now = self.clock()
        backoff = max(0.0, self.blocked_until - now)
        cap = self.max_concurrency
        if cap is None:
            return backoff
        rank = None if priority is None else RANK[priority]
        ahead = sum(1 for r, _ in self._waiters.values() if rank is None or r <= rank)
        self._expected = [(t, r) for t, r in self._expected if now - t < EXPECT_S]
        ahead += sum(1 for _, r in self._expected if rank is None or r <= rank)
        free = cap - self.in_flight
        if ahead < free:
            return backoff
        hold = self.hold_s or 0.0
        # when each slot frees: the free ones now, a held one after what is left of its hold
        frees = sorted(max(0.0, hold - (now - t)) for t in self._since)
        frees = ([0.0] * cap + frees)[-cap:]
        rounds, slot = divmod(ahead, cap)  # the requests ahead go first, slot by slot
        return max(backoff, frees[slot] + rounds * hold)

    def expect(self, priority: Priority) -> None:
        """A request was just routed here: count it ahead of later ones until it reaches the
        queue (`acquire`), at most `EXPECT_S`."""
        if self.max_concurrency is not None:
            self._expected.append((self.clock(), RANK[priority]))

    def _arrived(self, priority: Priority) -> None:
        """An announced request reached the queue: it counts as a waiter or a holder now."""
        rank = RANK[priority]
        mine = [e for e in self._expected if e[1] == rank] or self._expected
        if mine:
            self._expected.remove(mine[0])

    def note_retry_after(self, seconds: float) -> None:
        """The endpoint answered 429 with Retry-After: hold every request until then."""
        if seconds > 0 and math.isfinite(seconds):
            self.blocked_until = max(self.blocked_until, self.clock() + seconds)

    async def acquire(self, priority: Priority = "normal") -> float:
        """Wait for a slot (by class, then arrival); return the seconds waited. Raises
        `CloudQueueTimeoutError` after `queue_timeout_s` without one."""
        t0 = self.clock()
        self._arrived(priority)
        if self._free() and not self._waiters:
            self._take()
            return 0.0
        self._seq += 1
        seq, wake = self._seq, anyio.Event()
        self._waiters[seq] = (RANK[priority], wake)
        limit = self.queue_timeout_s
        try:
            with anyio.move_on_after(math.inf if limit is None else limit):
                while True:
                    backoff = self.blocked_until - self.clock()
                    if backoff > 0 and self.max_concurrency is not None:
                        await anyio.sleep(backoff)
                        self._wake_next()
                        continue
                    if self._next() == seq and self._free():
                        del self._waiters[seq]
                        self._take()
                        self._wake_next()  # more slots may be free
                        return self.clock() - t0
                    await wake.wait()
                    wake = anyio.Event()
                    self._waiters[seq] = (RANK[priority], wake)
        finally:
            if self._waiters.pop(seq, None) is not None:
                self._wake_next()  # it left (timed out, cancelled): the next may go
        raise CloudQueueTimeoutError(
            f"{self.engine} engine: no free slot within {limit:g} s (queue_timeout_s; "
            f"max_concurrency={self.max_concurrency}, {self.in_flight} in flight, "
            f"{self.waiting} waiting)",
            engine=self.engine,
            waiting=self.waiting,
            max_concurrency=self.max_concurrency,
            queue_timeout_s=limit,
        )

    def _take(self) -> None:
        self.in_flight += 1
        self._since.append(self.clock())

    def release(self, held_s: float) -> None:
        """A request let go of its slot after holding it `held_s` seconds."""
        self.in_flight -= 1
        if self._since:  # forget the holder that took its slot `held_s` ago (the nearest)
            took = self.clock() - held_s
            self._since.remove(min(self._since, key=lambda t: abs(t - took)))
        if held_s >= 0:
            self.hold_s = held_s if self.hold_s is None else 0.7 * self.hold_s + 0.3 * held_s
        self._wake_next()

    def _next(self) -> int | None:
        return min(self._waiters, key=lambda s: (self._waiters[s][0], s), default=None)

    def _wake_next(self) -> None:
        nxt = self._next()
        if nxt is not None:
            self._waiters[nxt][1].set()
