"""Plans beyond a single engine: the first-token race, hedging and mid-stream failover.

`race()`: the primary starts at once; the deadline (if the policy has one) counts from the
`stream()` call. If the primary has produced no content token by then, fails before its first
one, is predicted (by the routing decision) to miss the deadline, or a hedge delay passes, the
fallback starts while the primary keeps running. "By then" leads the deadline by the fallback's
own predicted time to a first token (at most half the deadline), so that its token can still
arrive inside the deadline. The first content token wins and the loser is cancelled at once (its
stream closed: connection dropped, local decoding stopped). Role-only chunks, keep-alives and
empty deltas never win.

Once an engine is streaming, a failure (reset, error event) or a stall longer than the policy's
inter-token limit moves the answer to the other engine, which continues from the text already
delivered (given as the start of the assistant turn): nothing repeated, nothing dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time

import anyio
from anyio.abc import TaskGroup

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.errors import (
    AllEnginesFailedError,
    DeadlineMissError,
    EngineError,
    RefusedError,
    StallError,
)
from hybridllm.events import Chunk, Fallback, Finish, Hedge, Mark
from hybridllm.runtime.stream import RequestRun

_Item = tuple[int, Chunk | Exception | None]  # contender id; None: that stream ended


@dataclasses.dataclass
class _Contender:
    engine: Engine
    scope: anyio.CancelScope
    marks: list[Mark] = dataclasses.field(default_factory=list)


class _Race:
    def __init__(
        self,
        run: RequestRun,
        primary: Engine,
        fallback: Engine,
        request: GenerationRequest,
        tg: TaskGroup,
    ) -> None:
        self.run = run
        self.primary = primary
        self.fallback = fallback
        self.request = request
        self.tg = tg
        self.send, self.recv = anyio.create_memory_object_stream[_Item](math.inf)
        self.ids = itertools.count()
        self.contenders: dict[int, _Contender] = {}
        self.failed: set[int] = set()
        self.winner: int | None = None
        self.finish: Finish | None = None
        self.failovers = 0
        self.attempts: list[tuple[str, BaseException, float]] = []
        self.deadline_at: float | None = None
        # the deadline timer started the fallback (perhaps ahead of the deadline, by its lead)
        self.deadline_fired = False

    def start(self, engine: Engine, request: GenerationRequest) -> int:
        cid = next(self.ids)
        self.contenders[cid] = c = _Contender(engine, anyio.CancelScope())
        if engine.name not in self.run.trace.started:
            self.run.trace.started.append(engine.name)
        self.tg.start_soon(self._contend, cid, c, request)
        return cid

    def start_fallback(self, why: str, *, hedge: bool = False) -> None:
        if any(c.engine is self.fallback for c in self.contenders.values()):
            return
        trace = self.run.trace
        trace.fallback_reason = why
        trace.hedged = hedge
        trace.mark("fallback_started")
        event = Hedge if hedge else Fallback
        self.run.emit(event(time.perf_counter(), self.primary.name, self.fallback.name, why))
        self.start(self.fallback, self.request)

    def record_failure(self, cid: int, exc: Exception) -> None:
        ms = (time.perf_counter() - self.run.trace.t_start) * 1e3
        self.attempts.append((self.contenders[cid].engine.name, exc, ms))

    def all_failed(self) -> AllEnginesFailedError:
        return AllEnginesFailedError(self.attempts, received_content=bool(self.run.delivered_text))

    def _post(self, item: _Item) -> None:
        """Hand an item to the coordinator; once it has stopped listening, drop it."""
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.send.send_nowait(item)

    async def _contend(self, cid: int, c: _Contender, request: GenerationRequest) -> None:
        with c.scope:
            try:
                await self.run.relay(c.engine, request, lambda ch: self._post((cid, ch)))
                self._post((cid, None))
            except Exception as exc:  # judged by the coordinator
                self._post((cid, exc))

    def crown(self, cid: int) -> None:
        """`cid` delivered first: cancel the others, replay its marks. A primary that lost the
        race past the deadline (or after the deadline timer started the fallback ahead of it) is
        reported as a deadline miss (it may open its circuit)."""
        self.winner = cid
        late = self.deadline_fired or (
            self.deadline_at is not None and time.perf_counter() > self.deadline_at
        )
        first_crown = not self.run.delivered_text and not self.failovers
        if late and first_crown and self.contenders[cid].engine is not self.primary:
            for other, c in self.contenders.items():
                if c.engine is self.primary and other not in self.failed:
                    self.run.outcome(
                        self.primary.name,
                        DeadlineMissError("no token before the deadline", engine=self.primary.name),
                    )
        for other, c in self.contenders.items():
            if other != cid:
                c.scope.cancel()
        c = self.contenders[cid]
        self.run.trace.engine = c.engine.name
        for mark in c.marks:
            self.run.trace.mark(mark.name, mark.t)

    def failover(self, exc: Exception, allowed: bool) -> bool:
        """The winner failed mid-stream: continue on the other engine from the delivered text."""
        wid = self.winner
        if wid is None or not allowed or self.failovers >= 1:
            return False
        old = self.contenders[wid]
        other = self.fallback if old.engine is self.primary else self.primary
        self.failovers += 1
        self.failed.add(wid)
        delivered = self.run.delivered_text
        trace = self.run.trace
        trace.switches.append(
            (time.perf_counter(), old.engine.name, other.name, str(exc), len(delivered))
        )
        self.run.emit(
            Fallback(
                time.perf_counter(),
                old.engine.name,
                other.name,
                f"{old.engine.name} failed mid-stream: {exc}",
            )
        )
        old.scope.cancel()
        cont = dataclasses.replace(
            self.request, assistant_prefix=self.request.assistant_prefix + delivered
        )
        self.crown(self.start(other, cont))
        return True


def fallback_lead_s(
    fallback: Engine,
    request: GenerationRequest,
    deadline_s: float,
    predicted: float | None = None,
) -> float:
    """How long before the deadline the fallback starts: its predicted time to a first token
    (`predicted`, else the engine's own estimate; so that token can still land by the deadline),
    at most half the deadline, so that a fallback which cannot make the deadline anyway does not
    run alongside every request."""
    if predicted is None:
        predicted = fallback.predict_ttft_s(request)
    if predicted is None:
        return 0.0
    return min(max(0.0, predicted), deadline_s / 2)


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
    failover: bool = True,
    fallback_now: str | None = None,
    fallback_ttft_s: float | None = None,
) -> None:
    """Run the race. `fallback_now`: start the fallback at once too, for this reason (the
    routing decision predicts the primary misses the deadline). `fallback_ttft_s`: the
    fallback's predicted time to a first token (None: ask the engine)."""
    trace = run.trace
    if deadline_s is None:
        why = f"{reason}; {fallback.name} takes over if it fails"
    else:
        why = f"{reason}; {fallback.name} starts if no token in {deadline_s * 1e3:.0f} ms"
    run.route(primary, why)
    fatal: Exception | None = None
    async with anyio.create_task_group() as tg:
        r = _Race(run, primary, fallback, request, tg)
        r.deadline_at = None if deadline_s is None else trace.t_start + deadline_s
        timer = anyio.CancelScope()

        async def timer_task() -> None:
            with timer:
                start_s = deadline_s
                if deadline_s is not None:  # lead so that the fallback's token lands in time
                    lead = fallback_lead_s(fallback, request, deadline_s, fallback_ttft_s)
                    start_s = deadline_s - lead
                hedge_first = hedge_s is not None and (start_s is None or hedge_s < start_s)
                at = hedge_s if hedge_first else start_s
                if at is None:
                    return
                await anyio.sleep(max(0.0, trace.t_start + at - time.perf_counter()))
                kind = "hedge: no" if hedge_first else "no"
                why = f"{kind} token from {primary.name} within {at * 1e3:.0f} ms"
                if not hedge_first and deadline_s is not None and at < deadline_s:
                    why += f" (started ahead of the {deadline_s * 1e3:.0f} ms deadline)"
                r.deadline_fired = not hedge_first
                r.start_fallback(why, hedge=hedge_first)

        r.start(primary, request)
        if fallback_now is not None:
            r.start_fallback(fallback_now)
        tg.start_soon(timer_task)
        async with r.recv:
            while True:
                item: Chunk | Exception | None
                with anyio.move_on_after(
                    math.inf if r.winner is None or stall_s is None else stall_s
                ) as quiet:
                    cid, item = await r.recv.receive()
                if quiet.cancelled_caught:  # the serving engine stalled
                    assert r.winner is not None
                    name = r.contenders[r.winner].engine.name
                    limit_ms = (stall_s or 0.0) * 1e3
                    cid, item = (
                        r.winner,
                        StallError(
                            f"no token for {limit_ms:.0f} ms", engine=name, received_content=True
                        ),
                    )
                if r.winner is not None and cid != r.winner:
                    continue  # what a cancelled contender sent before it stopped
                name = r.contenders[cid].engine.name
                if item is None and r.winner is None:  # ended without a token or a finish
                    item = EngineError("the engine stopped without finishing", engine=name)
                if isinstance(item, Exception):
                    r.record_failure(cid, item)
                    if r.winner == cid:
                        if r.failover(item, failover):
                            continue
                        # a failover that failed too: no engine could finish the answer
                        fatal = r.all_failed() if r.failovers else item
                        break
                    r.failed.add(cid)
                    if r.contenders[cid].engine is primary:
                        why = "refused" if isinstance(item, RefusedError) else "failed"
                        r.start_fallback(f"{primary.name} {why} before its first token: {item}")
                    if r.failed == set(r.contenders):
                        fatal = r.all_failed()  # every engine that was tried has failed
                        break
                    continue
                if item is None:
                    break  # the winner's stream ended
                if isinstance(item, Finish):
                    r.finish = item
                    if r.winner is None:  # an empty answer finished first: it wins
                        r.crown(cid)
                        timer.cancel()
                    continue
                if r.winner is None:
                    if isinstance(item, Mark) or not item.text:
                        if isinstance(item, Mark):
                            r.contenders[cid].marks.append(item)
                        continue
                    r.crown(cid)
                    timer.cancel()
                run.deliver(name, item)
        for c in r.contenders.values():
            c.scope.cancel()
        timer.cancel()
    if fatal is not None:
        raise fatal  # outside the task group: the app gets a typed, unwrapped error
    assert r.winner is not None
    run.complete(r.contenders[r.winner].engine.name, r.finish)
