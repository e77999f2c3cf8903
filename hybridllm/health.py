"""Circuit breakers: stop waiting on an engine that keeps failing.

After `threshold` consecutive failures (errors, or lost races past the first-token deadline) the
circuit opens: requests skip that engine (the local
engine serves at once instead of waiting for timeouts). After `reset_after_s` it is half-open:
one request may probe it; success closes the circuit, failure opens it again.
"""

from __future__ import annotations

import time
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
    failures: int = 0
    opened_at: float | None = None
    _probe_at: float | None = field(default=None, repr=False)

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if time.monotonic() - self.opened_at >= self.reset_after_s:
            return "half-open"
        return "open"

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
        if exc is None:
            self.failures = 0
            self.opened_at = self._probe_at = None
            return
        if not isinstance(exc, UNHEALTHY):
            return
        self.failures += 1
        if self._probe_at is not None or self.failures >= self.threshold:
            self.opened_at = time.monotonic()
            self._probe_at = None
