"""Retries before the first token, with tenacity.

Only failures that say "try again" are retried (`EngineError.retryable`: connect errors, timeouts,
429 and 5xx, and only while no content has been delivered), a 429's Retry-After is honoured, and
no attempt starts if its wait would end past the first-token deadline.
"""

from __future__ import annotations

import random

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from hybridllm import clock
from hybridllm.errors import EngineError, RateLimitError


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, EngineError) and exc.retryable


class RetryPolicy:
    def __init__(
        self, retries: int, deadline_at: float | None, base_s: float = 0.1, max_s: float = 2.0
    ) -> None:
        self.retries = retries
        self.deadline_at = deadline_at  # clock.now() time of the first-token deadline
        self.base_s = base_s
        self.max_s = max_s
        self.retried = 0

    def wait_s(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RateLimitError) and exc.retry_after is not None:
            return float(exc.retry_after)
        backoff: float = min(self.max_s, self.base_s * 2.0 ** (state.attempt_number - 1))
        return backoff * (0.5 + random.random() / 2)  # jitter

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number > self.retries:
            return True
        if self.deadline_at is None:
            return False
        return clock.now() + self.wait_s(state) > self.deadline_at

    def _count(self, state: RetryCallState) -> None:
        self.retried += 1

    def attempts(self) -> AsyncRetrying:
        """`async for attempt in policy.attempts(): with attempt: ...`"""
        return AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=self._stop,
            wait=self.wait_s,
            before_sleep=self._count,
            reraise=True,
        )
