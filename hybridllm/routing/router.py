"""`Router`: the probability that the local answer would be wrong, and thresholds for it.

    router = Router.load()                       # the shipped artifact (models/router/)
    p = router.score(messages)                   # P(the local answer is wrong, cloud needed)
    t = router.threshold(cloud_share=0.3)        # send about 30% of traffic to the cloud
    t = router.threshold(quality_floor=0.5)      # the least cloud use reaching that quality
    route = "cloud" if p > t else "local"

What the score predicts is the artifact's `label`: "cloud-needed" (the shipped default: the local
answer would be wrong and the cloud's right) or "local-wrong" (the local answer would be wrong).
Both rank prompts by need of the cloud; "cloud-needed" does not spend cloud calls on prompts
neither model answers. A router has one of two forms: "single", one linear model over
`features.extract` for the label, or "factored" (the shipped default), two heads, P(cloud right)
and P(local right), with score = P(cloud right) * (1 - P(local right)). Factoring helps because
each head learns from every row (the joint label is rare and mostly decided by whether the
cloud can answer). Each head is Platt-scaled on the calibration split; scoring is plain numpy
(one gather over the hashed buckets for all heads, no scikit-learn call per request). The
thresholds come from the calibration split: `cloud_share` from quantiles of its scores (or of
the user's own traffic after `recalibrate`), `quality_floor` from its labelled quality curve.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm.errors import RouterArtifactError, RouterThresholdError
from hybridllm.routing import artifact, features as F, stage2
from hybridllm.routing.heads import Calibration, Head, form_of, score_quantiles_of, threshold_of
from hybridllm.routing.stage2 import Stage2

LOGIT_BOUND = 12.0  # head log-odds are clipped to +-12


# artifacts from before the manifest named it: their signals were labelled on this model
STAGE2_MODEL_BEFORE = "qwen2.5-coder-0.5b-instruct"


class Router:
    """Scores prompts: the probability that the local answer would be wrong and the cloud is
    needed."""

    def __init__(
        self,
        *,
        heads: dict[str, Head] | None = None,
        weights: npt.NDArray[np.float64] | None = None,
        intercept: float = 0.0,
        platt: tuple[float, float] = (1.0, 0.0),
        calibration: Calibration,
        manifest: dict[str, Any] | None = None,
        path: Path | None = None,
    ) -> None:
        if heads is None:
            if weights is None:
                raise ValueError("give heads, or the weights of a single head")
            heads = {"label": Head(np.asarray(weights, dtype=np.float64), intercept, platt)}
        self.form = form_of(list(heads))
        self.heads = dict(heads)
        stacked = np.stack([h.weights for h in heads.values()], axis=1)  # (features, heads)
        self._w_hash = np.ascontiguousarray(stacked[: F.N_HASH], dtype=np.float64)
        self._w_dense = np.ascontiguousarray(stacked[F.N_HASH :].T, dtype=np.float64)
        self._intercepts = np.array([h.intercept for h in heads.values()], dtype=np.float64)
        self._platt = np.array([h.platt for h in heads.values()], dtype=np.float64)
        self.calibration = calibration
        self.manifest: dict[str, Any] = manifest or {}
        self.path = path
        # stage 2 (the local model's signals), by kind: "combined" and "signals" (stage2.py)
        self.stage2: dict[str, Stage2] = {}
        # the local model whose signals stage 2 was trained on (a manifest name or a file name)
        self.stage2_model: str | None = None

    @classmethod
    def load(cls, path: Path | str | None = None) -> Router:
        """Load a router directory (default: the shipped `models/router/`), checking its
        manifest, file hash and versions; any problem is a RouterArtifactError."""
        directory = Path(path) if path is not None else artifact.default_dir()
        parts = artifact.load_parts(directory)
        try:
            router = cls(heads=parts.heads, calibration=parts.calibration,
                         manifest=parts.manifest, path=directory)  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise RouterArtifactError(
                f"router artifact does not fit this router ({exc})",
                path=directory / artifact.MODEL_FILE,
                reason="malformed",
            ) from exc
        # the scores it was trained to give, given here (any scikit-learn that unpickles it)
        artifact.check_golden(parts.manifest, router.score, directory / artifact.MANIFEST_FILE)
        router.stage2 = stage2.load(directory, parts.manifest)
        if router.stage2:
            data = (parts.manifest.get("stage2") or {}).get("data") or {}
            router.stage2_model = str(data.get("model") or STAGE2_MODEL_BEFORE)
        return router

    # --- scoring -------------------------------------------------------------------------

    def features(self, messages: F.Messages) -> F.Features:
        return F.extract(messages)

    def head_logits(self, feats: F.Features) -> npt.NDArray[np.float64]:
        """Each head's uncalibrated linear score (log-odds before Platt scaling)."""
        h = feats.hashed
        z = self._intercepts + self._w_dense @ np.asarray(feats.dense, dtype=np.float64)
        if len(h):
            z = z + self._w_hash[h].sum(axis=0) * F.hashed_scale(len(h))
        return z

    def _probabilities(self, feats: F.Features) -> npt.NDArray[np.float64]:
        z = self._platt[:, 0] * self.head_logits(feats) + self._platt[:, 1]
        # a Platt fit on separable calibration data can be arbitrarily steep: keep every head
        # a probability strictly within (0, 1), about 6e-6 .. 1 - 6e-6
        z = np.clip(z, -LOGIT_BOUND, LOGIT_BOUND)
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def head_probabilities(self, feats: F.Features) -> dict[str, float]:
        """Each head's calibrated probability, by head name."""
        return dict(zip(self.heads, self._probabilities(feats).tolist(), strict=True))

    def raw_score(self, feats: F.Features) -> float:
        """A log-odds ordered like the score: the single head's before Platt scaling, or the
        logit of the factored score."""
        if self.form == "single":
            return float(self.head_logits(feats)[0])
        p = self.score_features(feats)
        p = min(max(p, 1e-12), 1.0 - 1e-12)
        return math.log(p / (1.0 - p))

    def score_features(self, feats: F.Features) -> float:
        p = self._probabilities(feats)  # in FORMS order
        if self.form == "single":
            return float(p[0])
        return float(p[0] * (1.0 - p[1]))  # cloud right, local right

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
        return threshold_of(self.calibration, cloud_share, quality_floor)

    def recalibrate(self, scores: Sequence[float]) -> Router:
        """A copy whose `cloud_share` thresholds come from these scores (e.g. the user's own
        traffic, `DecisionLog.scores()`); the labelled quality curve is kept."""
        s = np.asarray(scores, dtype=np.float64)
        if len(s) < 20:
            raise RouterThresholdError(f"recalibration needs at least 20 scores, got {len(s)}")
        if not np.all((s >= 0.0) & (s <= 1.0)):
            raise RouterThresholdError("scores must be probabilities within 0..1")
        quantiles = score_quantiles_of(s)
        new = replace(self.calibration, score_quantiles=quantiles, source=f"traffic n={len(s)}")
        clone = copy.copy(self)
        clone.calibration = new
        return clone
