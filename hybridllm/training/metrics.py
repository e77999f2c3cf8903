"""Routing metrics after RouteLLM (pure functions).

A router sends the prompts with the highest scores to the cloud. Routing the top k of n prompts
gives quality q(k/n) = share of prompts answered correctly by the engine each was sent to. Between
k and k+1 the curve is linear (the next prompt sent with that probability), and prompts with equal
scores are taken in random order, so the curve is the expected value: a router whose scores are
all equal is the random router, q(share) = q_weak + share * (q_strong - q_weak).

- PGR(share) = (q(share) - q_weak) / (q_strong - q_weak): performance gap recovered.
- APGR = the area under PGR over cloud share 0..1 (exact for the piecewise-linear curve).
- CPT(x) = the smallest cloud share whose PGR reaches x (None when it never does).

A trained router's `Calibration` is built from the same curve (`calibration_from_labelled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hybridllm.routing.heads import Calibration, score_quantiles_of

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Curve:
    """Quality at cloud shares k/n, k = 0..n (both arrays have n+1 entries)."""

    shares: FloatArray
    quality: FloatArray

    @property
    def q_weak(self) -> float:
        return float(self.quality[0])

    @property
    def q_strong(self) -> float:
        return float(self.quality[-1])

    @property
    def pgr(self) -> FloatArray:
        gap = self.q_strong - self.q_weak
        if gap == 0:
            return np.full_like(self.quality, np.nan)
        return (self.quality - self.q_weak) / gap

    def quality_at(self, share: float) -> float:
        return float(np.interp(share, self.shares, self.quality))

    def pgr_at(self, share: float) -> float:
        return float(np.interp(share, self.shares, self.pgr))


def routing_curve(
    scores: Sequence[float] | FloatArray,
    local_correct: Sequence[bool] | npt.NDArray[np.bool_],
    cloud_correct: Sequence[bool] | npt.NDArray[np.bool_],
) -> Curve:
    """The expected quality curve of routing the highest scores to the cloud first."""
    s = np.asarray(scores, dtype=np.float64)
    local = np.asarray(local_correct, dtype=np.float64)
    cloud = np.asarray(cloud_correct, dtype=np.float64)
    n = len(s)
    if n == 0 or len(local) != n or len(cloud) != n:
        raise ValueError("scores and labels must be non-empty and of equal length")
    order = np.argsort(-s, kind="stable")
    s, gain = s[order], (cloud - local)[order]
    # equal scores: every member of a tie group gets the group's mean gain (expected value)
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sums = np.add.reduceat(gain, starts)
    sizes = np.diff(np.r_[starts, n])
    gain = np.repeat(sums / sizes, sizes)
    quality = (local.sum() + np.r_[0.0, np.cumsum(gain)]) / n
    return Curve(shares=np.arange(n + 1) / n, quality=quality)


def apgr(curve: Curve) -> float:
    """Area under the PGR curve over cloud share 0..1."""
    p = curve.pgr
    return float(np.sum((p[1:] + p[:-1]) / 2 * np.diff(curve.shares)))


def cpt(curve: Curve, target: float) -> float | None:
    """The smallest cloud share at which PGR reaches `target` (linear between points)."""
    p = curve.pgr
    if np.isnan(p).any():
        return None
    hits = np.flatnonzero(p >= target - 1e-12)
    if len(hits) == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return 0.0
    x0, x1, y0, y1 = curve.shares[i - 1], curve.shares[i], p[i - 1], p[i]
    return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))


def apgr_interval(
    scores: Sequence[float] | FloatArray,
    local_correct: Sequence[bool] | npt.NDArray[np.bool_],
    cloud_correct: Sequence[bool] | npt.NDArray[np.bool_],
    *,
    level: float = 0.9,
    n_boot: int = 400,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A bootstrap interval for APGR (prompts resampled with replacement; draws where both
    engines score the same are skipped). None when too few draws are defined."""
    s = np.asarray(scores, dtype=np.float64)
    local = np.asarray(local_correct, dtype=bool)
    cloud = np.asarray(cloud_correct, dtype=bool)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        i = rng.integers(0, len(s), len(s))
        if local[i].sum() == cloud[i].sum():
            continue
        values.append(apgr(routing_curve(s[i], local[i], cloud[i])))
    if len(values) < n_boot // 2:
        return None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Summary:
    """The headline figures of one router on one set of prompts."""

    n: int
    q_weak: float
    q_strong: float
    apgr: float
    pgr: dict[float, float]  # cloud share -> PGR
    cpt: dict[float, float | None]  # PGR target -> cloud share


SHOWN_SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CPT_TARGETS = (0.5, 0.8, 0.95)


def summarize(curve: Curve) -> Summary:
    return Summary(
        n=len(curve.shares) - 1,
        q_weak=curve.q_weak,
        q_strong=curve.q_strong,
        apgr=apgr(curve),
        pgr={s: curve.pgr_at(s) for s in SHOWN_SHARES},
        cpt={t: cpt(curve, t) for t in CPT_TARGETS},
    )


def calibration_from_labelled(
    scores: Sequence[float] | FloatArray,
    local_correct: Sequence[bool],
    cloud_correct: Sequence[bool],
) -> Calibration:
    """A router's `Calibration` from its scores on labelled rows: the score quantiles and the
    quality curve, one row per prompt count sent to the cloud, thresholds decreasing."""
    s = np.asarray(scores, dtype=np.float64)
    curve = routing_curve(s, local_correct, cloud_correct)
    desc = np.sort(s)[::-1]
    # sending the top k: cloud iff score > the (k+1)-th highest score
    thresholds = np.r_[1.0, desc[1:], 0.0]
    rows = tuple(
        (round(float(t), 9), round(float(c), 9), round(float(q), 9))
        for t, c, q in zip(thresholds, curve.shares, curve.quality, strict=True)
    )
    return Calibration(score_quantiles=score_quantiles_of(s), curve=rows)
