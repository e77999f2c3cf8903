"""Plans beyond a single engine. For now: the first-token deadline race.

`race()`: the primary starts at once; the deadline (if the policy has one) counts from the
`stream()` call. If the primary has produced no content token by then, or fails before its first
one, the fallback starts while the primary keeps running. The first content token wins and the
loser is cancelled at once (its stream closed: connection dropped, local decoding stopped).
Role-only chunks, keep-alives and empty deltas never win.
"""

from __future__ import annotations

import math
import time

import anyio

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.errors import EngineError
from hybridllm.events import Chunk, EngineName, Fallback, Finish, Mark
from hybridllm.stream import RequestRun

_Item = tuple[EngineName, Chunk | Exception | None]  # None: that engine's stream ended


async def race(
    run: RequestRun,
    primary: Engine,
    fallback: Engine,
    request: GenerationRequest,
    *,
    deadline_s: float | None,
    reason: str,
    hedge_s: float | None = None,
) -> None:
    trace = run.trace
    if deadline_s is None:
        run.route(primary, f"{reason}; {fallback.name} takes over if it fails before a token")
    else:
        run.route(
            primary, f"{reason}; {fallback.name} starts if no token in {deadline_s * 1e3:.0f} ms"
        )
    send, recv = anyio.create_memory_object_stream[_Item](math.inf)
    scopes: dict[EngineName, anyio.CancelScope] = {}
    pending_marks: dict[EngineName, list[Mark]] = {primary.name: [], fallback.name: []}
    failures: dict[EngineName, Exception] = {}
    winner: EngineName | None = None
    finish: Finish | None = None
    fatal: Exception | None = None

    async def contend(engine: Engine, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await run.relay(
                    engine, request, lambda chunk: send.send_nowait((engine.name, chunk))
                )
                send.send_nowait((engine.name, None))
            except Exception as exc:  # judged by the coordinator below
                send.send_nowait((engine.name, exc))

    async with anyio.create_task_group() as tg:

        def start(engine: Engine, why: str) -> None:
            if engine.name in scopes:
                return
            scopes[engine.name] = scope = anyio.CancelScope()
            if engine.name not in trace.started:
                trace.started.append(engine.name)
            tg.start_soon(contend, engine, scope)
            if engine is fallback:
                trace.fallback_reason = why
                trace.mark("fallback_started")
                run.emit(Fallback(time.perf_counter(), primary.name, fallback.name, why))

        async def deadline() -> None:
            hedge_first = hedge_s is not None and (deadline_s is None or hedge_s < deadline_s)
            at = hedge_s if hedge_first else deadline_s
            if at is None:
                return
            await anyio.sleep(max(0.0, trace.t_start + at - time.perf_counter()))
            if hedge_first:
                trace.hedged = True
                start(fallback, f"hedge: no token from {primary.name} within {at * 1e3:.0f} ms")
            else:
                start(fallback, f"no token from {primary.name} within {at * 1e3:.0f} ms")

        timer = anyio.CancelScope()

        async def timer_task() -> None:
            with timer:
                await deadline()

        start(primary, "")
        predicted = primary.predict_ttft_s(request)
        if deadline_s is not None and predicted is not None and predicted > deadline_s:
            start(
                fallback,
                f"{primary.name} predicts a first token in {predicted * 1e3:.0f} ms, "
                f"past the {deadline_s * 1e3:.0f} ms deadline",
            )
        tg.start_soon(timer_task)
        async with recv:
            async for name, item in recv:
                if winner is not None and name != winner:
                    continue  # what the loser sent before it was cancelled
                if item is None and winner is None:  # ended without a token or a finish
                    item = EngineError("the engine stopped without finishing", engine=name)
                if isinstance(item, Exception):
                    if winner == name:
                        fatal = item  # failed after its first token (failover is a later issue)
                        break
                    failures[name] = item
                    if name == primary.name:
                        start(fallback, f"{primary.name} failed before its first token: {item}")
                    if len(failures) == len(scopes):
                        fatal = item  # every engine that was tried has failed
                        break
                    continue
                if item is None:
                    break  # the winner's stream ended
                if isinstance(item, Finish):
                    finish = item
                    if winner is None:  # an empty answer finished first: it wins
                        winner = _crown(run, name, scopes, pending_marks, timer)
                    continue
                if winner is None:
                    if isinstance(item, Mark) or not item.text:
                        if isinstance(item, Mark):
                            pending_marks[name].append(item)
                        continue
                    winner = _crown(run, name, scopes, pending_marks, timer)
                run.deliver(name, item)
        for scope in scopes.values():
            scope.cancel()
        timer.cancel()
    if fatal is not None:
        raise fatal  # outside the task group: the app gets the engine's own typed error
    assert winner is not None
    run.complete(winner, finish)


def _crown(
    run: RequestRun,
    name: EngineName,
    scopes: dict[EngineName, anyio.CancelScope],
    pending_marks: dict[EngineName, list[Mark]],
    timer: anyio.CancelScope,
) -> EngineName:
    """`name` delivered first: cancel the others and the deadline, replay its marks."""
    timer.cancel()
    for other, scope in scopes.items():
        if other != name:
            scope.cancel()
    run.trace.engine = name
    for mark in pending_marks[name]:
        run.trace.mark(mark.name, mark.t)
    return name
