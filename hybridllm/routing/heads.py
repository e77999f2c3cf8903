"""The router's parts: calibrated linear heads, the forms they make, and the calibration that
thresholds are computed from. Plain data, shared by the router, its artifact and training."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm.errors import RouterThresholdError
from hybridllm.routing import features as F

N_QUANTILES = 101  # score quantiles at 0, 1, ..., 100 percent


@dataclass(frozen=True)
class Calibration:
    """What thresholds are computed from.

    `score_quantiles[i]` is the i-th percentile of the scores (calibration split, or traffic);
    `curve` holds (threshold, cloud share, quality) on the labelled calibration split, one row
    per prompt count sent to the cloud, thresholds decreasing.
    """

    score_quantiles: tuple[float, ...]
    curve: tuple[tuple[float, float, float], ...]
    source: str = "calibration split"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "score_quantiles": list(self.score_quantiles),
            "curve": [list(r) for r in self.curve],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        return cls(
            score_quantiles=tuple(float(x) for x in data["score_quantiles"]),
            curve=tuple((float(a), float(b), float(c)) for a, b, c in data["curve"]),
            source=str(data.get("source", "calibration split")),
        )


def score_quantiles_of(scores: npt.NDArray[np.float64]) -> tuple[float, ...]:
    qs = np.quantile(scores, np.linspace(0.0, 1.0, N_QUANTILES))
    return tuple(round(float(q), 9) for q in qs)


@dataclass(frozen=True)
class Head:
    """One calibrated linear classifier: P = sigmoid(a * (w . x + c) + b), where x is the hashed
    n-gram counts (scaled) then the dense features of `features.extract`."""

    weights: npt.NDArray[np.float64]  # hashed buckets, then dense features
    intercept: float
    platt: tuple[float, float]  # (a, b)

    def __post_init__(self) -> None:
        expected = F.N_HASH + len(F.DENSE_NAMES)
        if self.weights.shape != (expected,):
            raise ValueError(f"weights must have shape ({expected},), got {self.weights.shape}")


# The router's forms: one head for the label itself, or the label factored into two heads,
# score = P(cloud right) * (1 - P(local right)) (conditional independence given the prompt).
FORMS: dict[str, tuple[str, ...]] = {
    "single": ("label",),
    "factored": ("cloud_right", "local_right"),
}


def form_of(heads: Sequence[str]) -> str:
    for form, names in FORMS.items():
        if tuple(heads) == names:
            return form
    raise ValueError(f"unknown router heads {list(heads)}; known: {list(FORMS.values())}")


def threshold_of(
    calibration: Calibration, cloud_share: float | None = None, quality_floor: float | None = None
) -> float:
    """The score above which a prompt goes to the cloud (`score > threshold`).

    Exactly one of: `cloud_share` (0..1, the share of traffic to send to the cloud, from
    the score quantiles) or `quality_floor` (0..1, the smallest cloud share whose quality,
    the share answered correctly on the labelled calibration split, reaches the floor).
    """
    if (cloud_share is None) == (quality_floor is None):
        raise RouterThresholdError("give exactly one of cloud_share or quality_floor")
    if cloud_share is not None:
        if not 0.0 <= cloud_share <= 1.0:
            raise RouterThresholdError(f"cloud_share must be within 0..1, got {cloud_share}")
        if cloud_share == 0.0:
            return 1.0
        if cloud_share == 1.0:
            return 0.0
        qs = calibration.score_quantiles
        pos = (1.0 - cloud_share) * (len(qs) - 1)
        return float(np.interp(pos, np.arange(len(qs)), qs))
    assert quality_floor is not None
    for t, _share, q in calibration.curve:
        if q >= quality_floor - 1e-12:
            return t
    best = max(calibration.curve, key=lambda r: r[2])
    raise RouterThresholdError(
        f"quality_floor {quality_floor} is above the best quality on the calibration split "
        f"({best[2]:.3f}, at cloud share {best[1]:.2f})"
    )
