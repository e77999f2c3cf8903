"""The single-engine plan: one engine, start to finish.

Failures that say "try again" (`EngineError.retryable`) before the first token are retried, at
most `retries` times and never past the first-token deadline (`runtime.retry`); anything after
the first token, or not retryable, reaches the app as it is.
"""

from __future__ import annotations

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import Chunk, Finish
from hybridllm.runtime.retry import RetryPolicy
from hybridllm.runtime.stream import RequestRun


async def single(
    run: RequestRun,
    engine: Engine,
    request: GenerationRequest,
    reason: str,
    retries: int = 0,
    deadline_s: float | None = None,
) -> None:
    """Run `request` on `engine` alone, routed there for `reason`."""
    run.route(engine, reason)
    finishes: list[Finish] = []

    def handle(chunk: Chunk) -> None:
        if isinstance(chunk, Finish):
            finishes.append(chunk)
        else:
            run.deliver(engine.name, chunk)

    policy = RetryPolicy(retries, None if deadline_s is None else run.trace.t_start + deadline_s)
    async for attempt in policy.attempts():
        with attempt:
            await run.relay(engine, request, handle)
    run.trace.retries = policy.retried
    run.complete(engine.name, finishes[-1] if finishes else None)
