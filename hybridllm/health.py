"""Circuit breakers: stop waiting on an engine that keeps failing.

Two kinds of bad outcome open the circuit:

- hard failures (refused or reset connections, timeouts, 5xx, 429, malformed streams):
  `threshold` of them in a row, so a dead endpoint is skipped after two requests;
- deadline misses (the engine lost the first-token race past the deadline): these happen now and
  then on any endpoint with a heavy latency tail, so they count by rate - at least `threshold`
  misses and at least `miss_rate` of the last `window` outcomes. An engine that stalls on every
  request opens the circuit after two; one that misses one request in ten never does.

While open, requests skip that engine (the local engine serves at once instead of waiting for
timeouts). After `reset_after_s` it is half-open: one request may probe it; success closes the
circuit, failure opens it again.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from hybridllm import errors

State = Literal["closed", "open", "half-open"]

# Failures that say the endpoint is unhealthy (not that the request or the configuration is wrong)
UNHEALTHY = (
    errors.CloudConnectionError,
    errors.CloudTimeoutError,
    errors.ServerError,
    errors.RateLimitError,
    errors.CloudProtocolError,
    errors.DeadlineMissError,
)


@dataclass
class CircuitBreaker:
    threshold: int = 2
    reset_after_s: float = 30.0
    window: int = 10
    miss_rate: float = 0.5
    failures: int = 0  # hard failures in a row
    opened_at: float | None = None
    _recent: deque[bool] = field(default_factory=deque, repr=False)  # True: a deadline miss
    _probe_at: float | None = field(default=None, repr=False)

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if time.monotonic() - self.opened_at >= self.reset_after_s:
            return "half-open"
        return "open"

    @property
    def recent_miss_rate(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def allow(self) -> bool:
        """May a request use the engine now? (A half-open circuit lets one probe through.)"""
        state = self.state
        if state == "closed":
            return True
        now = time.monotonic()
        # one probe at a time; a probe that never reported back expires like the circuit does
        if state == "half-open" and (
            self._probe_at is None or now - self._probe_at >= self.reset_after_s
        ):
            self._probe_at = now
            return True
        return False

    def record(self, exc: BaseException | None) -> None:
        """The outcome of a request: None for success, else the error it ended with."""
        if exc is not None and not isinstance(exc, UNHEALTHY):
            return  # the request or the configuration was wrong, not the endpoint
        miss = isinstance(exc, errors.DeadlineMissError)
        if exc is None or miss:
            self._recent.append(miss)
            while len(self._recent) > self.window:
                self._recent.popleft()
        probing = self._probe_at is not None
        if exc is None:
            self.failures = 0
            self.opened_at = self._probe_at = None
            return
        if miss:
            misses = sum(self._recent)
            trip = misses >= self.threshold and misses >= self.miss_rate * len(self._recent)
        else:
            self.failures += 1
            trip = self.failures >= self.threshold
        if probing or trip:
            self.opened_at = time.monotonic()
            self._probe_at = None
            self._recent.clear()  # after the reset, judge the engine afresh
