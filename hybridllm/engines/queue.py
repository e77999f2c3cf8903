"""`BoundedQueue`: one request at a time on an engine, served by priority then arrival, bounded.

A local engine runs one generation at a time; the others wait. Each request has a class
(`GenerationRequest.priority`, from the policy or the call): "interactive" before "normal" before
"background"; within a class, first come first served. Waiting ages a request: its class rises
one step for every `age_s` seconds it has waited (default 5 s; a background request that has
waited 10 s is served like an interactive one, and before the interactive ones that came after
it), so nothing waits without end behind a stream of more urgent requests. The rule reads the
queue's clock (`clock=`, `hybridllm.clock.now` by default), so tests can drive it.

Warm-ups (`Turn.idle`: a prefill ahead of a conversation's next turn) come after every class,
never age, and yield to any request that arrives, as below.

Preemption: when an interactive request arrives while a background request holds the engine,
the holder's `Turn.preempt` is set. The local engine cuts the decode step or prefill chunk under
way (llama.cpp's abort callback; only that step's or chunk's work is lost), so the background
request yields at once: it gives its turn back, waits again (keeping its
arrival and the time it has waited, so it ages on), and goes on from where it stopped. A
background request that has aged into a higher class is not preempted any more: every pause
adds to its waiting time, so it is paused a bounded number of times.

Left unbounded, a burst of requests waits without end (20 concurrent streams on a 2-core machine:
the last one waited 11 s for its first token). Two optional bounds, set on the engine:

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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from hybridllm.clock import now
from hybridllm.errors import ConfigError, QueueFullError
from hybridllm.events import Priority

_SEQ = itertools.count()
RANK: dict[Priority, int] = {"interactive": 0, "normal": 1, "background": 2}
DEFAULT_AGE_S = 5.0
IDLE_RANK = len(RANK)  # warm-ups: after every class


@dataclass
class Turn:
    """A request's place in the queue, kept across pauses (a preempted request waits again
    with the same `arrived` and the time it has `waited`)."""

    priority: Priority = "normal"
    arrived: float = 0.0
    waited: float = 0.0  # seconds waited in earlier turns
    estimate_s: float = 0.0
    # set by the queue when a more urgent request wants the engine (read from any thread)
    preempt: threading.Event = field(default_factory=threading.Event)
    preempt_reason: str = ""
    pauses: int = 0
    # a warm-up (a prefill ahead of a conversation's next turn): served only when nothing else
    # waits, never aged, and preempted by any request that arrives
    idle: bool = False
    _seq: int = field(default_factory=lambda: next(_SEQ))
    _since: float = 0.0  # when it joined the queue this time
    _granted: anyio.Event | None = None

    def rank(self, now: float, age_s: float) -> int:
        """The class it is served in now: its own, raised one step per `age_s` waited (a
        warm-up: below every class, always)."""
        if self.idle:
            return IDLE_RANK
        waited = self.waited + (now - self._since if self._granted is not None else 0.0)
        return max(0, RANK[self.priority] - int(waited // age_s))


class BoundedQueue:
    """The queue of one engine: priority classes with aging, the estimates of the requests it
    holds, bounds, and the preemption signal."""

    def __init__(
        self,
        engine: str,
        *,
        max_queue: int | None = None,
        max_queue_wait_s: float | None = None,
        age_s: float = DEFAULT_AGE_S,
        clock: Callable[[], float] = now,
    ) -> None:
        if max_queue is not None and (
            isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0
        ):
            raise ConfigError(f"max_queue must be an int >= 0 or None, not {max_queue!r}")
        for name, value in (("max_queue_wait_s", max_queue_wait_s), ("age_s", age_s)):
            if (name == "age_s" or value is not None) and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(f"{name} must be a finite number > 0, not {value!r}")
        self.engine = engine
        self.max_queue = max_queue
        self.max_queue_wait_s = None if max_queue_wait_s is None else float(max_queue_wait_s)
        self.age_s = float(age_s)
        self.clock = clock
        self.holder: Turn | None = None  # the request whose turn it is
        self.pending: dict[int, Turn] = {}  # waiting requests by sequence number
        self.active: tuple[float, float] | None = None  # (started at, estimated seconds)

    @property
    def waiting(self) -> int:
        return len(self.pending)

    @property
    def busy(self) -> bool:
        return self.holder is not None

    @property
    def depth(self) -> int:
        """Requests waiting plus the one running."""
        return self.waiting + (1 if self.busy else 0)

    def _preempts(self, priority: Priority | None) -> bool:
        """Would a request of `priority` arriving now preempt the holder? (A warm-up yields to
        any request: `priority` None asks for one of unknown class.)"""
        holder = self.holder
        if holder is not None and holder.idle:
            return True
        return (
            priority == "interactive"
            and holder is not None
            and holder.rank(self.clock(), self.age_s) == RANK["background"]
        )

    def expected_wait_s(self, priority: Priority | None = None) -> float:
        """Seconds a request queued now would wait before its turn (estimate). With its
        `priority`: only the waiting requests of its class or above count, and a holder it would
        preempt counts as nothing (it yields at once)."""
        rank = None if priority is None else RANK[priority]
        wait = sum(
            t.estimate_s
            for t in self.pending.values()
            if not t.idle and (rank is None or RANK[t.priority] <= rank)
        )
        if self.active is not None and not self._preempts(priority):
            started, est = self.active
            wait += max(0.0, est - (now() - started))
        return wait

    def unavailable(self) -> str | None:
        """Why a request made now would be refused (None: it would be taken)."""
        if not self.busy:
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

    async def acquire(
        self,
        estimate_s: float,
        priority: Priority = "normal",
        *,
        turn: Turn | None = None,
        idle: bool = False,
    ) -> Turn:
        """Wait for this request's turn (by class, then arrival), holding `estimate_s` (its
        expected run time) in the queue meanwhile, and return its `Turn`. `turn`: a paused
        request's own, to wait again with its arrival and its time waited (no bound refuses
        it: it was admitted once). Raises `QueueFullError` at once past a bound, or after
        `max_queue_wait_s` of waiting. The caller calls `release()` after its turn. `idle`: a
        warm-up (`Turn.idle`)."""
        now = self.clock()
        fresh = turn is None
        if turn is None:
            self.check()
            turn = Turn(priority, arrived=now, estimate_s=estimate_s, idle=idle)
        else:
            turn.estimate_s = estimate_s
        turn.preempt.clear()
        if self.holder is None and not self.pending:
            self.holder = turn  # free: this request's turn now, it never waited
            return turn
        turn._since, turn._granted = now, anyio.Event()
        self.pending[turn._seq] = turn
        if not turn.idle and self._preempts(turn.priority):
            assert self.holder is not None
            self.holder.preempt_reason = f"an {turn.priority} request is waiting"
            self.holder.preempt.set()
        limit = self.max_queue_wait_s if fresh else None
        try:
            with anyio.move_on_after(math.inf if limit is None else limit):
                await turn._granted.wait()
        except BaseException:
            self._leave(turn)
            if self.holder is turn:  # granted just as it was cancelled: pass the turn on
                self.release()
            raise
        self._leave(turn)
        if self.holder is turn:
            return turn
        if self.holder is None:
            self._grant()  # it left while it was next
        raise QueueFullError(
            f"{self.engine} engine: waited {limit:g} s (max_queue_wait_s) without a turn; "
            f"{self.waiting} still waiting",
            engine=self.engine,
            waiting=self.waiting,
            max_queue=self.max_queue,
            max_queue_wait_s=self.max_queue_wait_s,
        )

    def _leave(self, turn: Turn) -> None:
        if self.pending.pop(turn._seq, None) is not None:
            turn.waited += self.clock() - turn._since
        turn._granted = None

    def next_up(self) -> Turn | None:
        """The waiting request served next: the best class now (aged), then the earliest."""
        now = self.clock()
        return min(
            self.pending.values(),
            key=lambda t: (t.rank(now, self.age_s), t.arrived, t._seq),
            default=None,
        )

    def _grant(self) -> None:
        nxt = self.next_up()
        if nxt is not None and nxt._granted is not None:
            self.holder = nxt
            nxt._granted.set()

    def release(self) -> None:
        """End the holder's turn and hand the engine to the next request."""
        self.active = None
        self.holder = None
        self._grant()
