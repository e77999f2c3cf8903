"""What feeds `decide()`: the protocols of a router, a budget and a privacy scan, and the
latency model's `Prediction` (produced in the runtime, read here).

Plain protocols, so any object with these methods plugs in (the trained router, the budget
ledger, the privacy detector) without this package importing them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hybridllm.events import EngineName

if TYPE_CHECKING:
    from hybridllm.policy import Policy, Tenant


class Scorer(Protocol):
    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        """P(the local model's answer is wrong), in [0, 1]."""
        ...

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        """The score at and above which a request goes to the cloud."""
        ...


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    fits: bool  # the worst-case cloud cost fits every cap
    detail: str = ""  # for the reason, e.g. "day cap 0.50 USD, left 0.01 USD"


class BudgetGate(Protocol):
    def check(
        self,
        policy: Policy,
        prompt_tokens: int,
        max_tokens: int,
        engine: EngineName = "cloud",
        user: str | None = None,
        tenant: Tenant | None = None,
    ) -> BudgetVerdict:
        """Could a cloud request of this size be paid for now on `engine` (worst case), for
        the end user `user` billed to `tenant` (None: no user's or tenant's caps)?"""
        ...


class PrivacyScan(Protocol):
    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        deep: bool = True,
        extra: Iterable[tuple[str, str]] = (),
    ) -> Collection[str]:
        """The kinds of personal or secret data found in the conversation (never the values):
        each message, and the messages read back to back as the cloud would receive them;
        `extra`: more (location, text) pairs the request sends (its tool definitions).
        `deep` False: the cheap patterns only (the request cannot reach the cloud)."""
        ...


@dataclass(frozen=True, slots=True)
class Prediction:
    """Expected and p95 seconds for one request on one engine, if sent now."""

    engine: EngineName
    ttft_s: float
    ttft_p95_s: float
    total_s: float
    total_p95_s: float
    tpot_s: float
    queue_s: float = 0.0
    samples: int = 0  # requests behind the figures (0: the prior only)
    drift_s: float = 0.0  # shift applied for recent requests running slower (+) or faster (-)
    source: str = "model"  # "model" (learned or seeded) or "engine" (the engine's own guess)
    # the TTFT distribution behind the figures, seconds, sorted: this request's expected TTFT
    # plus each residual the model has seen (empty: no history); the automatic hedge reads it
    ttft_samples: tuple[float, ...] = ()
    # the TTFT a rescue's lead is measured by (None: the p95): the expected TTFT times the worst
    # recent ratio of a backup's own TTFT to its prediction, conservative while they are few
    # (`runtime.latency.EngineLatency.backup_factor`)
    rescue_ttft_s: float | None = None
