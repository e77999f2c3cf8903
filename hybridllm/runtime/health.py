"""Circuit breakers: stop waiting on an engine that keeps failing.

Two kinds of bad outcome open the circuit:

- hard failures (refused or reset connections, timeouts, 5xx, 429, malformed streams):
  `threshold` of them in a row, so a dead endpoint is skipped after two requests;
- deadline misses (the engine lost the first-token race past the deadline): these happen now and
  then on any endpoint with a heavy latency tail, so they count by rate, judged on evidence - at
  least `miss_rate` of the last `window` outcomes, and only once `min_outcomes` of them are
  seen (two unlucky draws at the start tell a heavy tail from a broken endpoint no better than
  two lucky ones). An engine that misses every request opens the circuit after `min_outcomes`;
  one that misses one request in ten never does. A circuit opened by misses (slow, not broken,
  `slow`) is probed again after `miss_reset_after_s`, and routing still sends it the requests
  chosen for quality (their local rescue covers the deadline), whose outcomes close it again.

While open, requests skip that engine (the local engine serves at once instead of waiting for
timeouts). After `reset_after_s` it is half-open: one request may probe it; success closes the
circuit, failure opens it again. A preview of the decision (`HybridClient.decide()`) reads the
circuit with `would_allow()`, which never takes that probe.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import anyio

from hybridllm import clock, errors
from hybridllm.engines.base import Engine
from hybridllm.engines.capabilities import Checks, EngineCheck, Wraps
from hybridllm.events import EngineName

log = logging.getLogger(__name__)
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
    name: str = "engine"  # the engine it guards (its log records say it)
    threshold: int = 2
    reset_after_s: float = 30.0
    window: int = 10
    miss_rate: float = 0.5
    min_outcomes: int = 5  # deadline misses are judged over at least this many outcomes
    # opened by deadline misses (slow, not broken): probe again sooner
    miss_reset_after_s: float = 10.0
    failures: int = 0  # hard failures in a row
    opened_at: float | None = None
    _recent: deque[bool] = field(default_factory=deque, repr=False)  # True: a deadline miss
    # the last `window` outcomes of every kind, True: a hard failure (successes and misses
    # False): hard failures in a row open the circuit where they are half the recent outcomes
    _hard: deque[bool] = field(default_factory=deque, repr=False)
    _probe_at: float | None = field(default=None, repr=False)
    _open_for_s: float = field(default=30.0, repr=False)
    _slow: bool = field(default=False, repr=False)  # opened by deadline misses

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if clock.now() - self.opened_at >= self._open_for_s:
            return "half-open"
        return "open"

    @property
    def slow(self) -> bool:
        """Open (or half-open) for deadline misses: slow, not broken."""
        return self.opened_at is not None and self._slow

    @property
    def recent_miss_rate(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def _broken(self) -> bool:
        """Hard failures say the endpoint is down: `threshold` in a row where they are at least
        half the recent outcomes (an endpoint failing one request in ten that fails two in a
        row by chance keeps serving), or twice `threshold` in a row whatever came before. Both
        are counted since the circuit last opened: its outcomes are judged afresh."""
        in_a_row = 0  # since the last other outcome, or since the circuit last opened
        for hard in reversed(self._hard):
            if not hard:
                break
            in_a_row += 1
        if in_a_row >= 2 * self.threshold:
            return True
        share = sum(self._hard) / len(self._hard)
        return in_a_row >= self.threshold and share >= self.miss_rate

    def allow(self) -> bool:
        """May a request use the engine now? (A half-open circuit lets one probe through: this
        takes it.)"""
        return self._admit(take_probe=True)

    def would_allow(self) -> bool:
        """Would a request be let through now? Reads the state only: a preview of the decision
        asks this, and leaves the half-open probe to the next real request."""
        return self._admit(take_probe=False)

    def _admit(self, *, take_probe: bool) -> bool:
        state = self.state
        if state == "closed":
            return True
        now = clock.now()
        # one probe at a time; a probe that never reported back expires like the circuit does
        if state == "half-open" and (
            self._probe_at is None or now - self._probe_at >= self._open_for_s
        ):
            if take_probe:
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
        self._hard.append(exc is not None and not miss)
        while len(self._hard) > self.window:
            self._hard.popleft()
        probing = self._probe_at is not None
        if exc is None:
            if self.opened_at is not None:
                log.info("%s circuit closed: a request succeeded", self.name)
            self.failures = 0
            self.opened_at = self._probe_at = None
            return
        if miss:
            misses, seen = sum(self._recent), len(self._recent)
            # judged on evidence: the rate over at least `min_outcomes` outcomes
            judged = seen >= self.min_outcomes
            trip = misses >= self.threshold and judged and misses >= self.miss_rate * seen
        else:
            self.failures += 1
            trip = self._broken()
        if probing or trip:
            self.opened_at = clock.now()
            self._probe_at = None
            self._open_for_s = self.miss_reset_after_s if miss else self.reset_after_s
            self._slow = miss
            why = "deadline misses" if miss else f"{type(exc).__name__} ({self.failures} in a row)"
            log.warning("%s circuit open for %.0f s: %s", self.name, self._open_for_s, why)
            self._recent.clear()  # after the reset, judge the engine afresh
            self._hard.clear()


@dataclass(frozen=True, slots=True)
class EngineState:
    """An engine's state (`HybridClient.check()`): what its own check found (`check`: reachable,
    key accepted, model found), its circuit, and why it cannot take a request now
    (`unavailable`: a missing or refused key, a full queue; None: it can)."""

    name: EngineName
    check: EngineCheck
    circuit: State
    unavailable: str | None = None

    @property
    def serves(self) -> bool:
        """It can take a request now: its check found nothing wrong, its circuit is not open
        and nothing makes it unavailable."""
        return self.check.serves and self.circuit != "open" and self.unavailable is None

    @property
    def cause(self) -> str | None:
        """Why it does not serve, in words (None: it serves)."""
        if self.unavailable is not None:
            return self.unavailable
        if self.circuit == "open":
            return "its circuit is open (it failed recently)"
        return None if self.check.serves else self.check.detail


UNCHECKED = EngineCheck(None, None, None, "the engine has no check of its own")


async def check_engines(
    engines: Mapping[EngineName, Engine],
    breakers: Mapping[EngineName, CircuitBreaker],
    timeout_s: float,
) -> dict[EngineName, EngineState]:
    """Each engine's state, its checks run side by side (a wrapper's engine is checked: the
    cloud guard's), each within `timeout_s`. A state that does not serve is logged at WARNING."""
    found: dict[EngineName, EngineCheck] = {}

    async def one(name: EngineName, engine: Engine) -> None:
        inner = engine.wrapped() if isinstance(engine, Wraps) else engine
        found[name] = await inner.check(timeout_s) if isinstance(inner, Checks) else UNCHECKED

    async with anyio.create_task_group() as tg:
        for name, engine in engines.items():
            tg.start_soon(one, name, engine)
    states = {
        name: EngineState(name, found[name], breakers[name].state, engine.info().unavailable)
        for name, engine in engines.items()
    }
    for state in states.values():
        if not state.serves:
            log.warning("the %s engine cannot serve now: %s", state.name, state.cause)
    return states
