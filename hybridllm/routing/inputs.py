"""What the client asks of the pieces that feed `decide()`: a router, a budget, a privacy scan.

Plain protocols, so any object with these methods plugs in (the trained router, the budget
ledger, the privacy detector) without this package importing them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hybridllm.policy import Policy


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
    def check(self, policy: Policy, prompt_tokens: int, max_tokens: int) -> BudgetVerdict:
        """Could a cloud request of this size be paid for now (worst case)?"""
        ...


class PrivacyScan(Protocol):
    def __call__(self, text: str) -> Collection[str]:
        """The kinds of personal or secret data found in `text` (never the values)."""
        ...
