"""The race plan: the first-token deadline race, hedging and mid-stream failover.

`race()`: the primary starts at once; the deadline (if the policy has one) counts from the
`stream()` call. If the primary has produced no content token by then, fails before its first
one, or a hedge delay passes, the fallback starts while the primary keeps running (a `Fallback`,
a `Hedge` event). "By then" leads the deadline by the fallback's own predicted time to a first
token (at most half the deadline), so that its token can still arrive inside the deadline; a
rescue's lead is its p95 time, at most the whole deadline (`routing.hedging.lead_s`).
Where the routing decision predicts the primary misses the deadline (`fallback_now`), the
fallback starts in parallel with it at once, announced as a `ParallelStart` right after the
`Route` (whose reason is then the decision's alone). The first content token wins and the loser
is cancelled at once (its stream closed: connection dropped, local decoding stopped). Role-only
chunks, keep-alives and empty deltas never win.

A rescue (`release_s`: the cloud was chosen for quality, `Decision.release_s`) does not
compete: the fallback may start early (its lead, a hedge) and prefill, but what it sends is held
until `release_s` after the call passes without a primary token, or the primary fails before
its first one. Then what it holds is delivered at once (a rescue at about the deadline, not the
deadline plus its TTFT), and from then on the first token wins. A primary token before that
wins, and the held fallback is cancelled. A held rescue that can continue an answer
(`EngineInfo.supports_continuation`) is parked at its first text token: its stream stops there
(the local engine keeps the prompt and that token in its KV cache), so it does not decode into
a buffer beside the primary on a shared device, and on the release the same engine goes on from
the held text (`assistant_prefix`), after the held token has gone out.

Once an engine is streaming, a failure (reset, error event) or a stall longer than the policy's
inter-token limit (`StallError`) moves the answer to the next engine, which continues from the
text already delivered (given as the start of the assistant turn): nothing repeated, nothing
dropped. Each engine gets the answer at most once; a continuation that fails with no engine
left ends the request.

More than one cloud (`backups`: the policy's other clouds that can serve now, in its order): the
engines are tried in one order, the chain: a cloud primary, the other clouds, then the device's
engine; a device primary, then the clouds. A failure before the first token starts the next
engine in the chain that has not started; a rescue's hold (the device's engine) lasts while
another cloud may still answer. A mid-stream failure moves the answer to the next engine in the
chain that has not failed (a backup cloud takes it where it can continue an answer).

One coordinator, `_Race.serve()`, owns the race's state: each contender's task and the timer
task only post items (`ContenderItem`, `_TimerFired`) to it, and it handles them one at a time,
one method per kind (a content chunk, a finish, a stream's end, an error, a stall, the timer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import Sequence

import anyio
from anyio.abc import TaskGroup

from hybridllm import clock
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.errors import (
    AllEnginesFailedError,
    DeadlineMissError,
    EngineError,
    PreemptedError,
    RefusedError,
    StallError,
)
from hybridllm.events import (
    Called,
    CallOpened,
    Chunk,
    Delta,
    FallbackCause,
    Finish,
    Mark,
    is_content,
)
from hybridllm.routing.hedging import lead_s
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import SpendRole, spend_role

# what a contender's task posts: its id, and a chunk, the error it ended with, or None (its
# stream ended)
ContenderItem = tuple[int, Chunk | Exception | None]


@dataclasses.dataclass(frozen=True)
class _TimerFired:
    """The deadline (less the fallback's lead) or the hedge delay passed."""

    why: str
    cause: FallbackCause  # "deadline", "rescue" (started at once) or "hedge"


@dataclasses.dataclass(frozen=True)
class _BackupDue:
    """The next cloud must start now to answer by the deadline (its predicted time to a first
    token before it)."""


@dataclasses.dataclass(frozen=True)
class _Released:
    """The rescue's hold is over (`release_s` passed without a primary token)."""


_RaceItem = ContenderItem | _TimerFired | _Released | _BackupDue

# the part a fallback plays, for money, by why it started (any other cause: "fallback")
_FALLBACK_ROLES: dict[FallbackCause, SpendRole] = {"hedge": "hedge", "parallel": "parallel"}


@dataclasses.dataclass
class _Contender:
    engine: Engine
    scope: anyio.CancelScope
    role: SpendRole = "primary"
    marks: list[Mark] = dataclasses.field(default_factory=list)
    # a rescue's items held until the release (None: not held)
    held: list[Chunk | None] | None = None
    # a held rescue stopped at its first text token: it goes on from there on the release
    parked: bool = False
    opened: bool = False  # it named a tool call (`CallOpened`): its answer has started


def fallback_lead_s(
    fallback: Engine,
    request: GenerationRequest,
    deadline_s: float,
    predicted: float | None = None,
    *,
    rescue: bool = False,
) -> float:
    """How long before the deadline the fallback starts (`routing.hedging.lead_s`), from its
    predicted time to a first token (`predicted`, else the engine's own estimate; none: 0)."""
    if predicted is None:
        predicted = fallback.predict_ttft_s(request)
    return 0.0 if predicted is None else lead_s(predicted, deadline_s, rescue=rescue)


async def race(
    run: RequestRun,
    primary: Engine,
    fallback: Engine,
    request: GenerationRequest,
    *,
    deadline_s: float | None,
    reason: str,
    hedge_s: float | None = None,
    stall_s: float | None = None,
    fallback_now: bool = False,
    parallel_reason: str = "",
    fallback_ttft_s: float | None = None,
    failover: bool = True,
    release_s: float | None = None,
    backups: Sequence[Engine] = (),
    backup_ttft_s: Sequence[float | None] = (),
) -> None:
    """Run the race. `fallback_now`: start the fallback at once too, in parallel (the routing
    decision predicts the primary misses the deadline; `parallel_reason` says so in words).
    `fallback_ttft_s`: the fallback's predicted time to a first token (None: ask the engine; 0:
    no lead, the fallback starts at the deadline itself). `failover`: whether an answer that
    fails mid-stream may continue on the other engine (the decision says no where an engine
    cannot continue an answer). `release_s`: the fallback is a rescue, its tokens held until
    this long after the call or the primary's failure (None: the first token wins). `backups`:
    the other clouds, in order (see the module); `backup_ttft_s`: their predicted times to a
    first token (None: unknown), by which the next one starts ahead of the deadline."""
    if fallback_now:
        why = reason  # the fallback starts now: no deadline to wait for
    elif deadline_s is None:
        why = f"{reason}; {fallback.name} takes over if it fails"
    else:
        why = f"{reason}; {fallback.name} starts if no token in {deadline_s * 1e3:.0f} ms"
    run.route(primary, why)
    async with anyio.create_task_group() as tg:
        r = _Race(
            run,
            primary,
            fallback,
            request,
            tg,
            deadline_s=deadline_s,
            stall_s=stall_s,
            failover=failover,
            release_s=release_s,
            backups=backups,
            backup_ttft_s=backup_ttft_s,
        )
        parallel = (fallback_now, parallel_reason)
        await r.serve(hedge_s=hedge_s, parallel=parallel, fallback_ttft_s=fallback_ttft_s)
    r.conclude()  # outside the task group: the app gets a typed, unwrapped error


class _Race:
    """The state of one race and its coordinator."""

    def __init__(
        self,
        run: RequestRun,
        primary: Engine,
        fallback: Engine,
        request: GenerationRequest,
        tg: TaskGroup,
        *,
        deadline_s: float | None,
        stall_s: float | None,
        failover: bool = True,
        release_s: float | None = None,
        backups: Sequence[Engine] = (),
        backup_ttft_s: Sequence[float | None] = (),
    ) -> None:
        self.run = run
        self.failover = failover
        self.primary = primary
        self.fallback = fallback
        self.backups = tuple(backups)
        self.backup_ttft_s = tuple(backup_ttft_s)
        self.backup_timer = anyio.CancelScope()
        ahead = [fallback, *backups] if primary.info().on_device else [*backups, fallback]
        self.chain: tuple[Engine, ...] = (primary, *ahead)  # the order engines are tried in
        self.gave_up: list[Engine] = []  # the engines that failed while serving the answer
        self.request = request
        self.tg = tg
        self.deadline_s = deadline_s
        self.stall_s = stall_s
        self.send, self.recv = anyio.create_memory_object_stream[_RaceItem](math.inf)
        self.ids = itertools.count()
        self.contenders: dict[int, _Contender] = {}
        self.failed: set[int] = set()
        self.winner: int | None = None
        self.finish: Finish | None = None
        self.failovers = 0
        self.attempts: list[tuple[str, BaseException, float]] = []
        self.deadline_at = None if deadline_s is None else run.trace.t_start + deadline_s
        # the deadline timer started the fallback (perhaps ahead of the deadline, by its lead)
        self.deadline_fired = False
        self.timer = anyio.CancelScope()
        self.over = False  # the winner's stream ended, or the race failed (`fatal`)
        self.fatal: Exception | None = None
        self.paused = False  # the serving engine paused the answer (preempted on the device)
        # a rescue's hold: until this time (None: not held, or released)
        self.release_at = None if release_s is None else run.trace.t_start + release_s
        self.resumed_tokens = 0  # a parked rescue's tokens delivered before it went on

    # ---- the coordinator ---------------------------------------------------------------------

    async def serve(
        self,
        *,
        hedge_s: float | None,
        parallel: tuple[bool, str],
        fallback_ttft_s: float | None,
    ) -> None:
        """Start the primary (and the fallback at once where `parallel` says so, with the words
        of its `ParallelStart`) and the timer, then handle what they post until the race is
        over; nothing is left running when it returns."""
        now, why = parallel
        try:
            self.start(self.primary, self.request)
            if now:
                self.start_fallback(why, "parallel")
            self.tg.start_soon(self._timer_task, hedge_s, fallback_ttft_s)
            if self.backups and self.deadline_s is not None:
                self.tg.start_soon(self._backup_timer_task)
            async with self.recv:
                while not self.over:
                    await self._next()
        finally:
            for c in self.contenders.values():
                c.scope.cancel()
            self.timer.cancel()
            self.backup_timer.cancel()
            self.send.close()  # what a stopping contender still posts is dropped (`_post`)

    async def _next(self) -> None:
        """Wait for the next item (while an engine is serving, at most the stall limit) and hand
        it to its handler."""
        limit = self.stall_s
        if limit is None or self.winner is None or self.paused or not self._answer_started():
            limit = math.inf  # no stall limit before the crown, nor before the answer starts
        with anyio.move_on_after(limit) as quiet:
            item = await self.recv.receive()
        if quiet.cancelled_caught:
            self._on_stall()
        elif isinstance(item, _TimerFired):
            self._on_timer(item)
        elif isinstance(item, _Released):
            self.release()
        elif isinstance(item, _BackupDue):
            self._on_backup_due()
        else:
            self._dispatch(*item)

    def _opened_in_time(self, chunk: Delta | Called | Mark) -> bool:
        """A tool call named inside the first-token deadline (or where there is none)."""
        at = self.deadline_at
        return isinstance(chunk, CallOpened) and (at is None or chunk.t <= at)

    def _answer_started(self) -> bool:
        """The answer has started: text or a call reached the app, or the serving engine named
        a call (a crowned engine that goes on from nothing delivered, after a named call that
        failed its check, has its first token's time: the stall limit is for gaps)."""
        assert self.winner is not None
        run = self.run
        return bool(run.delivered_text or run.calls) or self.contenders[self.winner].opened

    def _dispatch(self, cid: int, got: Chunk | Exception | None) -> None:
        """Hand one contender's item to its handler (a held rescue's chunks wait)."""
        if self.winner is not None and cid != self.winner:
            return  # what a cancelled contender sent before it stopped
        c = self.contenders[cid]
        if c.parked:
            return  # what a parked rescue sent before it stopped
        if c.held is not None and not isinstance(got, Exception):
            c.held.append(got)
            if isinstance(got, Delta) and is_content(got) and self._parks(c):
                c.parked = True
                c.scope.cancel()
            return
        if got is None:
            self._on_end(cid)
        elif isinstance(got, Exception):
            self._on_error(cid, got)
        elif isinstance(got, Finish):
            self._on_finish(cid, got)
        else:
            self._on_chunk(cid, got)

    def conclude(self) -> None:
        """After the task group: raise the race's error, or complete the request."""
        if self.fatal is not None:
            raise self.fatal
        assert self.winner is not None
        self.run.complete(self.contenders[self.winner].engine.name, self.finish)

    # ---- one handler per kind of item -------------------------------------------------------

    def _on_chunk(self, cid: int, chunk: Delta | Called | Mark) -> None:
        """A content token crowns its contender (if none won yet) and reaches the app, and so
        does a tool call opened inside the deadline (`CallOpened`: its name chosen, the answer
        has started; the call comes whole later; one opened later does not stop the engines
        already racing it); another mark or an empty delta before the crown never wins (marks
        are kept for the winner)."""
        if self.winner is None:
            if not is_content(chunk) and not self._opened_in_time(chunk):
                if isinstance(chunk, Mark):
                    self.contenders[cid].marks.append(chunk)
                return
            self.crown(cid)
        if isinstance(chunk, CallOpened):
            self.contenders[cid].opened = True
        if isinstance(chunk, Mark) and chunk.name in ("paused", "resumed"):
            self.paused = chunk.name == "paused"  # waiting for the device is not a stall
            engine = self.contenders[cid].engine
            on_device = engine.info().on_device
            if self.paused and on_device and self.fail_over(_preempted(engine.name)):
                self.paused = False  # moved to the other engine (where the policy allows it)
                return
        self.run.deliver(self.contenders[cid].engine.name, chunk)

    def _on_finish(self, cid: int, finish: Finish) -> None:
        if self.resumed_tokens:  # a parked rescue went on (its held tokens are its attempt's):
            # what the continuation found in the KV cache is not the prompt's
            finish = dataclasses.replace(finish, cached_prompt_tokens=None)
        self.finish = finish
        if self.winner is None:  # an empty answer finished first: it wins
            self.crown(cid)

    def _on_end(self, cid: int) -> None:
        if self.winner is None:  # ended without a token or a finish
            name = self.contenders[cid].engine.name
            self._on_error(cid, EngineError("the engine stopped without finishing", engine=name))
        else:
            self.over = True  # the winner's stream ended

    def _on_stall(self) -> None:
        """The serving engine sent nothing for longer than the stall limit."""
        assert self.winner is not None and self.stall_s is not None
        name = self.contenders[self.winner].engine.name
        self._on_error(self.winner, StallError.after(self.stall_s, name))

    def _on_error(self, cid: int, exc: Exception) -> None:
        self.record_failure(cid, exc)
        if self.winner == cid:
            if not self.fail_over(exc):
                # a failover that failed too: no engine could finish the answer
                self._fail(self.all_failed() if self.failovers else exc)
            return
        self.failed.add(cid)
        failed = self.contenders[cid].engine
        if failed is not self.fallback or not self.rescuing:
            cause: FallbackCause = "refused" if isinstance(exc, RefusedError) else "failed"
            why = f"{failed.name} {cause} before its first token: {exc}"
            self.start_next(why, cause, failed)
            if not self._cloud_running():
                self.release()  # a rescue waits no more: no cloud is left to answer
        if self.failed == set(self.contenders):
            self._fail(self.all_failed())  # every engine that was tried has failed

    def _on_timer(self, fired: _TimerFired) -> None:
        if self.winner is not None:
            return  # posted just before the crown cancelled the timer
        self.deadline_fired = fired.cause != "hedge"
        if self.deadline_fired and self._next_backup_ttft() == (None,):
            self._start_next_backup(fired.why, fired.cause)  # no prediction: start it now
        self.start_fallback(fired.why, fired.cause)

    def _next_backup_ttft(self) -> tuple[float | None] | tuple[()]:
        """The predicted time to a first token of the next backup cloud not started (one-tuple;
        None: unknown); () where none is left or the primary is the device's engine."""
        if self.primary.info().on_device:
            return ()
        for engine, predicted in itertools.zip_longest(self.backups, self.backup_ttft_s):
            if engine is not None and not self._started(engine):
                if predicted is None:
                    predicted = engine.predict_ttft_s(self.request)
                return (predicted,)
        return ()

    def _start_next_backup(self, why: str, cause: FallbackCause) -> None:
        for engine in self.backups:
            if not self._started(engine):
                self._start_engine(engine, why, cause, self.primary)
                return

    def _on_backup_due(self) -> None:
        """A cloud late for the deadline: the next cloud, which can still answer by it, starts
        (competing: the first token wins) before the device's rescue could serve."""
        if self.winner is not None or self.deadline_s is None:
            return
        why = (
            f"no token from {self.primary.name} yet: the next cloud starts to answer by the "
            f"{self.deadline_s * 1e3:.0f} ms deadline"
        )
        self._start_next_backup(why, "deadline")

    # ---- the moves --------------------------------------------------------------------------

    def release(self) -> None:
        """The rescue's hold is over: what a held contender sent is handled now, in order (its
        first token wins at once), and from now on the first token wins."""
        if self.release_at is None or self.winner is not None:
            return
        self.release_at = None
        now = clock.now()
        self.run.mark("rescue_released", now)
        for cid, c in list(self.contenders.items()):
            held, c.held = c.held, None
            parked, c.parked = c.parked, False
            for got in held or ():
                if isinstance(got, Delta | Called) and is_content(got):  # reaches the app now;
                    self.run.mark("rescue_first_token", got.t)  # the engine's own time
                    got = dataclasses.replace(got, t=max(got.t, now))
                self._dispatch(cid, got)
            if parked and self.winner == cid:
                self._resume(c)

    def _parks(self, c: _Contender) -> bool:
        """Whether a held rescue stops at its first text token (and goes on from it on the
        release): plain text (a tool call or a JSON answer is not continued), more than one token
        asked for, an engine that can continue an answer."""
        request = self.request
        return (
            request.tools is None
            and request.max_tokens > 1
            and c.engine.info().supports_continuation
        )

    def _resume(self, parked: _Contender) -> None:
        """The released rescue was parked: the same engine goes on from the text delivered (its
        held tokens), for what is left of max_tokens, and serves from here."""
        trace = self.run.trace
        self.run.mark("rescue_resumed")
        cont = dataclasses.replace(
            self.request,
            assistant_prefix=self.request.assistant_prefix + self.run.delivered_text,
            max_tokens=max(1, self.request.max_tokens - trace.n_tokens),
        )
        self.resumed_tokens = trace.n_tokens
        self.crown(self.start(parked.engine, cont, "continuation"))

    def start(self, engine: Engine, request: GenerationRequest, role: SpendRole = "primary") -> int:
        cid = next(self.ids)
        self.contenders[cid] = c = _Contender(engine, anyio.CancelScope(), role)
        if engine is self.fallback and role != "continuation" and self.rescuing:
            c.held = []  # a rescue: what it sends waits for the release
        self.run.started(engine.name)
        self.tg.start_soon(self._contend, cid, c, request)
        return cid

    @property
    def rescuing(self) -> bool:
        """The fallback is a rescue whose tokens are held (a quality decision)."""
        return self.release_at is not None

    def _started(self, engine: Engine) -> bool:
        return any(c.engine is engine for c in self.contenders.values())

    def _cloud_running(self) -> bool:
        """Is a cloud other than a held rescue still running (it may yet answer)?"""
        return any(
            cid not in self.failed and c.held is None and not c.engine.info().on_device
            for cid, c in self.contenders.items()
        )

    def start_fallback(self, why: str, cause: FallbackCause) -> None:
        """Start the fallback beside the primary: on the deadline or a failure, by a hedge, or
        in parallel from the start (a predicted deadline miss)."""
        self._start_engine(self.fallback, why, cause, self.primary)

    def start_next(self, why: str, cause: FallbackCause, after: Engine) -> None:
        """`after` failed before its first token: start the next engine in the chain that has
        not started (a backup cloud before the device's engine)."""
        for engine in self.chain:
            if not self._started(engine):
                self._start_engine(engine, why, cause, after)
                return

    def _start_engine(self, engine: Engine, why: str, cause: FallbackCause, after: Engine) -> None:
        if self._started(engine):
            return
        self.run.mark("fallback_started")
        role: SpendRole = _FALLBACK_ROLES.get(cause, "fallback")
        self.run.fell_back(after.name, engine.name, why, cause)
        self.start(engine, self.request, role)

    def crown(self, cid: int) -> None:
        """`cid` delivered first: cancel the others and the timer, replay its marks."""
        self.winner = cid
        self.timer.cancel()
        self.backup_timer.cancel()
        self._report_late_primary(cid)
        for other, c in self.contenders.items():
            if other != cid:
                c.scope.cancel()
        c = self.contenders[cid]
        self.run.serving(c.engine.name)
        for mark in c.marks:
            self.run.mark(mark.name, mark.t)

    def _report_late_primary(self, cid: int) -> None:
        """A primary that lost the race past the deadline (or after the deadline timer started
        the fallback ahead of it) is reported as a deadline miss (it may open its circuit),
        unless the miss was foreseen: a parallel start is the decision's answer to a primary
        predicted late, and the latency model already routes on that prediction."""
        late = self.deadline_fired or (
            self.deadline_at is not None and clock.now() > self.deadline_at
        )
        first_crown = not self.run.delivered_text and not self.failovers
        foreseen = self.run.trace.parallel_start is not None
        if not late or not first_crown or foreseen or self.contenders[cid].engine is self.primary:
            return
        for other, c in self.contenders.items():
            if c.engine is self.primary and other not in self.failed:
                miss = DeadlineMissError("no token before the deadline", engine=self.primary.name)
                self.run.outcome(self.primary.name, miss)

    def _next_for(self, failed: Engine) -> Engine | None:
        """The engine that goes on from an answer `failed` dropped: the next in the chain that
        has not failed serving it (the primary and the fallback where the decision allows a
        failover; a backup cloud where it can continue an answer); None: none is left."""
        self.gave_up.append(failed)
        for engine in self.chain:
            if any(engine is g for g in self.gave_up):
                continue
            backup = any(engine is b for b in self.backups)
            if engine.info().supports_continuation if backup else self.failover:
                return engine
        return None

    def fail_over(self, exc: Exception) -> bool:
        """The winner failed mid-stream: continue on the next engine from the delivered text
        (each engine once). False: no engine is left, or a tool call was delivered (a call
        is whole: the other engine cannot continue an answer past it)."""
        wid = self.winner
        if wid is None or self.run.calls:
            return False
        old = self.contenders[wid]
        other = self._next_for(old.engine)
        if other is None:
            return False
        self.failovers += 1
        self.failed.add(wid)
        delivered = self.run.delivered_text
        trace = self.run.trace
        self.run.switched(old.engine.name, other.name, exc)
        old.scope.cancel()
        cont = dataclasses.replace(  # the rest of the answer: what is left of max_tokens
            self.request,
            assistant_prefix=self.request.assistant_prefix + delivered,
            max_tokens=max(1, self.request.max_tokens - trace.n_tokens),
        )
        self.crown(self.start(other, cont, "continuation"))
        return True

    def record_failure(self, cid: int, exc: Exception) -> None:
        ms = (clock.now() - self.run.trace.t_start) * 1e3
        self.attempts.append((self.contenders[cid].engine.name, exc, ms))

    def all_failed(self) -> AllEnginesFailedError:
        return AllEnginesFailedError(self.attempts, received_content=bool(self.run.delivered_text))

    def _fail(self, exc: Exception) -> None:
        self.fatal = exc
        self.over = True

    # ---- the tasks: they only post ----------------------------------------------------------

    def _post(self, item: _RaceItem) -> None:
        """Hand an item to the coordinator; once it has stopped listening, drop it."""
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.send.send_nowait(item)

    async def _contend(self, cid: int, c: _Contender, request: GenerationRequest) -> None:
        spend_role.set(c.role)  # this task's own context: what its cloud request costs is tagged
        with c.scope:
            try:
                await self.run.relay(c.engine, request, lambda ch: self._post((cid, ch)))
                self._post((cid, None))
            except Exception as exc:  # judged by the coordinator
                self._post((cid, exc))

    async def _timer_task(self, hedge_s: float | None, fallback_ttft_s: float | None) -> None:
        """Post `_TimerFired` at the hedge delay or at the deadline less the fallback's lead,
        whichever comes first (the other never fires: the fallback is running by then)."""
        deadline_s = self.deadline_s
        with self.timer:
            start_s = deadline_s
            if deadline_s is not None:  # lead so that the fallback's token lands in time
                lead = fallback_lead_s(
                    self.fallback,
                    self.request,
                    deadline_s,
                    fallback_ttft_s,
                    rescue=self.release_at is not None,
                )
                start_s = deadline_s - lead
            hedge_first = hedge_s is not None and (start_s is None or hedge_s < start_s)
            at = hedge_s if hedge_first else start_s
            if at is None:
                return
            await anyio.sleep(max(0.0, self.run.trace.t_start + at - clock.now()))
            self._post(_TimerFired(*self._timer_reason(at, hedge_first)))
            await self._release_timer()

    def _timer_reason(self, at: float, hedge_first: bool) -> tuple[str, FallbackCause]:
        """Why the timer starts the fallback `at` seconds in: in words, and typed."""
        deadline_s = self.deadline_s
        rescue = self.release_at is not None
        cause: FallbackCause = "hedge" if hedge_first else "deadline"
        if rescue and not hedge_first and at <= 0.0 and deadline_s is not None:
            cause = "rescue"
            why = (
                f"{self.fallback.name} starts at once as a rescue (it could not be ready by the "
                f"{deadline_s * 1e3:.0f} ms deadline if it waited)"
            )
        else:
            kind = "hedge: no" if hedge_first else "no"
            why = f"{kind} token from {self.primary.name} within {at * 1e3:.0f} ms"
            if not hedge_first and deadline_s is not None and at < deadline_s:
                why += f" (started ahead of the {deadline_s * 1e3:.0f} ms deadline)"
        if rescue:
            why += f"; a rescue: its tokens are held until {self._hold_ms():.0f} ms"
        return why, cause

    def _hold_ms(self) -> float:
        assert self.release_at is not None
        return (self.release_at - self.run.trace.t_start) * 1e3

    async def _backup_timer_task(self) -> None:
        """Post `_BackupDue` when the next cloud must start to answer by the deadline (its
        predicted time to a first token before it); one predicted past the deadline does not
        start for it (only on a failure), one without a prediction starts with the device's
        rescue (`_on_timer`)."""
        ahead = self._next_backup_ttft()
        assert self.deadline_s is not None
        if not ahead or ahead[0] is None or ahead[0] > self.deadline_s:
            return
        with self.backup_timer:
            at = self.run.trace.t_start + self.deadline_s - ahead[0]
            await anyio.sleep(max(0.0, at - clock.now()))
            self._post(_BackupDue())

    async def _release_timer(self) -> None:
        """Post `_Released` when the rescue's hold is over (never, for a hold without end)."""
        at = self.release_at
        if at is None or math.isinf(at):
            return
        await anyio.sleep(max(0.0, at - clock.now()))
        self._post(_Released())


def _preempted(engine: str) -> PreemptedError:
    return PreemptedError(
        "preempted by a more urgent request on the device", engine=engine, received_content=True
    )
