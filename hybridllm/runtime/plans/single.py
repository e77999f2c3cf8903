"""The single-engine plan: one engine, start to finish.

Failures that say "try again" (`EngineError.retryable`) before the first token are retried by
the relay, as in every plan (`runtime.retry`); anything after the first token, or not
retryable, reaches the app as it is. Once the engine is streaming, a
silence longer than the policy's `stall_ms` (`stall_s`) ends the answer with a `StallError`
(received content, so not retried), as it does in the race, where the other engine would take
over.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from hybridllm import clock, errors
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.errors import StallError
from hybridllm.events import Chunk, Delta, EngineName, Finish, Mark, Partial, Resumed
from hybridllm.runtime.stream import RequestRun


async def single(
    run: RequestRun,
    engine: Engine,
    request: GenerationRequest,
    reason: str,
    stall_s: float | None = None,
) -> None:
    """Run `request` on `engine` alone, routed there for `reason`."""
    run.route(engine, reason)
    handle, finishes = collector(run, engine.name)
    await relay_watched(run, engine, request, handle, stall_s)
    run.complete(engine.name, finishes[-1] if finishes else None)


async def relay_watched(
    run: RequestRun,
    engine: Engine,
    request: GenerationRequest,
    handle: Callable[[Chunk], None],
    stall_s: float | None,
) -> None:
    """`run.relay`, ended by a `StallError` when text stops for longer than `stall_s` once the
    first text has come (before it, the first-token deadline and the engine's timeouts rule)."""
    if stall_s is None:
        await run.relay(engine, request, handle)
        return
    last: float | None = None
    stalled = False

    def watched(chunk: Chunk) -> None:
        nonlocal last
        if isinstance(chunk, Delta | Resumed | Partial) or (
            isinstance(chunk, Mark) and chunk.name == "seam_held"  # a token held at a seam
        ):
            last = clock.now()
        elif isinstance(chunk, Mark) and chunk.name == "paused":
            last = None  # preempted on the device: waiting for its turn is not a stall
        handle(chunk)

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal stalled
        while True:
            wait = stall_s if last is None else last + stall_s - clock.now()
            if last is not None and wait <= 0:
                stalled = True
                scope.cancel()
                return
            await anyio.sleep(wait)

    try:  # the engine's error comes out as itself, not in an ExceptionGroup (`first_error`)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            await run.relay(engine, request, watched)
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise errors.first_error(group) from None
    if stalled:
        raise StallError.after(stall_s, engine.name)


def collector(run: RequestRun, name: EngineName) -> tuple[Callable[[Chunk], None], list[Finish]]:
    """A relay handler that delivers `name`'s chunks and keeps its finishes aside."""
    finishes: list[Finish] = []

    def handle(chunk: Chunk) -> None:
        if isinstance(chunk, Finish):
            finishes.append(chunk)
        else:
            run.deliver(name, chunk)

    return handle, finishes
