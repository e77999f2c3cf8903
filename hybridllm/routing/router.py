"""`Router`: the probability that the local answer would be wrong, and thresholds for it.

    router = Router.load()                       # the shipped artifact (models/router/)
    p = router.score(messages)                   # P(the local answer is wrong, cloud needed)
    t = router.threshold(cloud_share=0.3)        # send about 30% of traffic to the cloud
    t = router.threshold(quality_floor=0.5)      # the least cloud use reaching that quality
    route = "cloud" if p > t else "local"

What the score predicts is the artifact's `label`: "cloud-needed" (the shipped default: the local
answer would be wrong and the cloud's right) or "local-wrong" (the local answer would be wrong).
Both rank prompts by need of the cloud; "cloud-needed" does not spend cloud calls on prompts
neither model answers. The score is a linear model over `features.extract` followed by Platt
scaling fitted on the calibration split, evaluated here with plain numpy (no scikit-learn call
per request). The thresholds come from the calibration split: `cloud_share` from quantiles of
its scores (or of the user's own traffic after `recalibrate`), `quality_floor` from its
labelled quality curve.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import RouterThresholdError
from . import features as F

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

    @classmethod
    def from_labelled(
        cls,
        scores: Sequence[float] | npt.NDArray[np.float64],
        local_correct: Sequence[bool],
        cloud_correct: Sequence[bool],
    ) -> Calibration:
        from .metrics import routing_curve

        s = np.asarray(scores, dtype=np.float64)
        curve = routing_curve(s, local_correct, cloud_correct)
        desc = np.sort(s)[::-1]
        # sending the top k: cloud iff score > the (k+1)-th highest score
        thresholds = np.r_[1.0, desc[1:], 0.0]
        rows = tuple(
            (round(float(t), 9), round(float(c), 9), round(float(q), 9))
            for t, c, q in zip(thresholds, curve.shares, curve.quality, strict=True)
        )
        return cls(score_quantiles=_quantiles(s), curve=rows)

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


def _quantiles(scores: npt.NDArray[np.float64]) -> tuple[float, ...]:
    qs = np.quantile(scores, np.linspace(0.0, 1.0, N_QUANTILES))
    return tuple(round(float(q), 9) for q in qs)


class Router:
    """Scores prompts: the probability that the local answer would be wrong and the cloud is
    needed."""

    def __init__(
        self,
        *,
        weights: npt.NDArray[np.float64],
        intercept: float,
        platt: tuple[float, float],
        calibration: Calibration,
        manifest: dict[str, Any] | None = None,
        path: Path | None = None,
    ) -> None:
        expected = F.N_HASH + len(F.DENSE_NAMES)
        if weights.shape != (expected,):
            raise ValueError(f"weights must have shape ({expected},), got {weights.shape}")
        self._w_hash = np.ascontiguousarray(weights[: F.N_HASH], dtype=np.float64)
        self._w_dense = np.ascontiguousarray(weights[F.N_HASH :], dtype=np.float64)
        self._intercept = float(intercept)
        self._platt = (float(platt[0]), float(platt[1]))
        self.calibration = calibration
        self.manifest: dict[str, Any] = manifest or {}
        self.path = path

    @classmethod
    def load(cls, path: Path | str | None = None) -> Router:
        """Load a router directory (default: the shipped `models/router/`), checking its
        manifest, file hash and versions; any problem is a RouterArtifactError."""
        from .artifact import load_router

        return load_router(Path(path) if path is not None else None)

    def parameters(self) -> tuple[npt.NDArray[np.float64], float, tuple[float, float]]:
        """(weights: hashed then dense, intercept, Platt (a, b)): score = sigmoid(a*z + b)."""
        return np.r_[self._w_hash, self._w_dense], self._intercept, self._platt

    # --- scoring -------------------------------------------------------------------------

    def features(self, messages: F.Messages) -> F.Features:
        return F.extract(messages)

    def raw_score(self, feats: F.Features) -> float:
        """The uncalibrated linear score (log-odds before Platt scaling)."""
        h = feats.hashed
        z = self._intercept + float(np.dot(self._w_dense, feats.dense))
        if len(h):
            z += float(self._w_hash[h].sum()) * F.hashed_scale(len(h))
        return z

    def score_features(self, feats: F.Features) -> float:
        a, b = self._platt
        return _sigmoid(a * self.raw_score(feats) + b)

    @property
    def label(self) -> str:
        """What the score is the probability of: "cloud-needed" or "local-wrong"."""
        return str(self.manifest.get("label", "cloud-needed"))

    def score(self, messages: F.Messages) -> float:
        """The probability that the local answer would be wrong and the cloud is needed
        (see `label`); high means send it to the cloud."""
        return self.score_features(F.extract(messages))

    # --- thresholds ----------------------------------------------------------------------

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
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
            qs = self.calibration.score_quantiles
            pos = (1.0 - cloud_share) * (len(qs) - 1)
            return float(np.interp(pos, np.arange(len(qs)), qs))
        assert quality_floor is not None
        for t, _share, q in self.calibration.curve:
            if q >= quality_floor - 1e-12:
                return t
        best = max(self.calibration.curve, key=lambda r: r[2])
        raise RouterThresholdError(
            f"quality_floor {quality_floor} is above the best quality on the calibration split "
            f"({best[2]:.3f}, at cloud share {best[1]:.2f})"
        )

    def recalibrate(self, scores: Sequence[float]) -> Router:
        """A copy whose `cloud_share` thresholds come from these scores (e.g. the user's own
        traffic, `DecisionLog.scores()`); the labelled quality curve is kept."""
        s = np.asarray(scores, dtype=np.float64)
        if len(s) < 20:
            raise RouterThresholdError(f"recalibration needs at least 20 scores, got {len(s)}")
        if not np.all((s >= 0.0) & (s <= 1.0)):
            raise RouterThresholdError("scores must be probabilities within 0..1")
        new = replace(self.calibration, score_quantiles=_quantiles(s), source=f"traffic n={len(s)}")
        clone = copy.copy(self)
        clone.calibration = new
        return clone


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
