"""Retries before the first content token, for every engine request of every plan.

`RequestRun.relay` is the one place where a plan streams an engine (the single plan, the race's
primary, fallback and hedge, the handoff's cloud continuation, the cascade's cloud, the
speculative plan's plain streaming), and it runs each stream through `RetryPolicy.run`. Only
failures that say "try again" are retried (`EngineError.retryable`: connect errors, timeouts,
429 and 5xx), at most the policy's `retries` times, with a jittered exponential backoff or a
429's Retry-After. Never once the stream has yielded content (a text delta or a finish): what
the app may have seen is never asked for twice. While nothing has reached the app, no retry
starts whose wait would end past the first-token deadline: where the plan has another engine,
that one is the rescue from then on (the race's timer starts it at the deadline).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from hybridllm import clock
from hybridllm.errors import EngineError, RateLimitError

__all__ = ["RetryPolicy", "Tries"]


@dataclass
class Tries:
    """One relayed stream's attempts: `content` is set once the engine yielded content (from
    then on nothing is retried)."""

    content: bool = False
    n: int = 1  # this attempt's number (2, 3, ...: retries)


class RetryPolicy:
    """`retries`: the most retries of one stream; `deadline_at`: the request's first-token
    deadline as a `clock.now()` time (None: none); backoff `base_s * 2**n`, at most
    `max_s`, jittered to 50-100%."""

    def __init__(
        self,
        retries: int = 0,
        deadline_at: float | None = None,
        base_s: float = 0.1,
        max_s: float = 2.0,
    ) -> None:
        self.retries = retries
        self.deadline_at = deadline_at
        self.base_s = base_s
        self.max_s = max_s

    def wait_s(self, exc: Exception, retried: int, *, first_token_due: bool) -> float | None:
        """Seconds to wait before retrying after `exc` (the stream's `retried`-th retry so far);
        None: no retry (not retryable, out of retries, or past the deadline while the first
        token is still due)."""
        if not isinstance(exc, EngineError) or not exc.retryable or retried >= self.retries:
            return None
        if isinstance(exc, RateLimitError) and exc.retry_after is not None:
            wait = float(exc.retry_after)
        else:
            wait = min(self.max_s, self.base_s * 2.0**retried) * (0.5 + random.random() / 2)
        if first_token_due and self.deadline_at is not None:
            if clock.now() + wait > self.deadline_at:
                return None
        return wait

    async def run(
        self,
        attempt: Callable[[Tries], Awaitable[None]],
        *,
        first_token_due: Callable[[], bool],
        on_retry: Callable[[EngineError], None],
    ) -> None:
        """Await `attempt` until it returns, retrying it as the policy allows; the last error
        propagates as it is. `first_token_due()`: nothing has reached the app yet (the
        deadline rules); `on_retry(exc)`: told of each failure that is retried."""
        tries = Tries()
        retried = 0
        while True:
            try:
                await attempt(tries)
                return
            except EngineError as exc:
                due = first_token_due()
                wait = None if tries.content else self.wait_s(exc, retried, first_token_due=due)
                if wait is None:
                    raise
                on_retry(exc)
            retried += 1
            tries.n = retried + 1
            await anyio.sleep(wait)
