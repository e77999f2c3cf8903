"""Router stage 2: the local model's own confidence on this prompt, combined with stage 1.

Stage 1 (`Router`) sees the prompt's text only: which kind of task it is. Stage 2 adds the local
model's signals on this very prompt (`LlamaCppEngine.signals()`: the next-token distribution
after the prefill, the log-probabilities of the first greedy answer tokens, the option-letter
probability of a multiple-choice prompt; their names are in the manifest). Two calibrated
logistic heads over [stage-1 head log-odds, signals] give P(cloud right) and P(local right);
score = P(cloud right) * (1 - P(local right)), on the scale of stage 1's score. A "signals"
stage 2 (no text inputs) is what the local signals alone can do.

The stage-1 inputs are out-of-fold on the training rows (each row's stage-1 log-odds from heads
fitted without it), so stage 2 learns how far to trust stage 1 on prompts stage 1 did not see.
Scoring is plain numpy; scikit-learn only fits (and unpickles, in the artifact) the heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm.routing.heads import Calibration
from hybridllm.routing.score import RouterScore

HEADS = ("cloud_right", "local_right")
LOGIT_BOUND = 12.0
Signals = Mapping[str, float | None]
FloatArray = npt.NDArray[np.float64]


def signal_inputs(signals: Signals, names: Sequence[str]) -> FloatArray:
    """The signals in `names` order; a missing or NaN figure (no options: not multiple choice)
    is 0, and `is_choice` tells the heads which figures apply."""
    out = np.zeros(len(names), dtype=np.float64)
    for i, name in enumerate(names):
        v = signals.get(name)
        if v is not None and not math.isnan(float(v)):
            out[i] = float(v)
    return out


@dataclass(frozen=True)
class DenseHead:
    """P = sigmoid(a * (w . ((x - mean) / scale) + c) + b)."""

    weights: FloatArray
    intercept: float
    platt: tuple[float, float]

    def logit(self, x: FloatArray) -> float:
        return float(self.weights @ x + self.intercept)

    def prob(self, x: FloatArray) -> float:
        z = self.platt[0] * self.logit(x) + self.platt[1]
        z = min(max(z, -LOGIT_BOUND), LOGIT_BOUND)
        return 1.0 / (1.0 + math.exp(-z))


@dataclass(frozen=True)
class Stage2:
    """A fitted stage 2: `score(text_logits, signals)`; `text_logits` are stage 1's head
    log-odds (`Router.head_logits`), ignored by a signals-only stage 2."""

    signal_names: tuple[str, ...]
    text_inputs: int  # how many stage-1 log-odds come first (0: signals only)
    mean: FloatArray
    scale: FloatArray
    heads: dict[str, DenseHead]
    calibration: Calibration

    def inputs(self, text_logits: Sequence[float] | FloatArray, signals: Signals) -> FloatArray:
        t = np.clip(np.asarray(text_logits, dtype=np.float64)[: self.text_inputs], -20, 20)
        raw = np.r_[t, interactions(signal_inputs(signals, self.signal_names), self.signal_names)]
        return np.asarray((raw - self.mean) / self.scale, dtype=np.float64)

    def probabilities(
        self, text_logits: Sequence[float] | FloatArray, signals: Signals
    ) -> dict[str, float]:
        x = self.inputs(text_logits, signals)
        return {name: head.prob(x) for name, head in self.heads.items()}

    def score(self, text_logits: Sequence[float] | FloatArray, signals: Signals) -> float:
        p = self.probabilities(text_logits, signals)
        return p["cloud_right"] * (1.0 - p["local_right"])

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        """The score above which a prompt goes to the cloud, as `Router.threshold`, from this
        stage's own calibration split."""
        from hybridllm.routing.heads import threshold_of

        return threshold_of(self.calibration, cloud_share, quality_floor)

    def to_json(self) -> dict[str, Any]:
        """The manifest's description (the heads' numbers are in the skops and weights files)."""
        return {
            "signal_names": list(self.signal_names),
            "text_inputs": self.text_inputs,
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
            "heads": list(self.heads),
            "calibration": self.calibration.to_json(),
        }


def interactions(x: FloatArray, names: Sequence[str]) -> FloatArray:
    """The signals plus each answer-token figure times `is_choice` (a letter answer's
    log-probabilities mean something else than a free answer's)."""
    if "is_choice" not in names:
        return x
    mc = x[list(names).index("is_choice")]
    extra = [x[i] * mc for i, n in enumerate(names) if n.startswith(("first_", "lp_"))]
    return np.asarray(np.r_[x, np.asarray(extra, dtype=np.float64)], dtype=np.float64)


def head_from(clf: Any, platt: Any) -> DenseHead:
    return DenseHead(
        weights=np.asarray(clf.coef_, dtype=np.float64).ravel(),
        intercept=float(np.ravel(clf.intercept_)[0]),
        platt=(float(np.ravel(platt.coef_)[0]), float(np.ravel(platt.intercept_)[0])),
    )


KINDS = ("combined", "signals")  # stage-1 log-odds and signals; the signals alone
# The same two without the option-rotation figures (`perm_*`,
# `engines/llama/option_rotations.py`): they score a multiple-choice prompt read without its
# rotations (a cascade whose hold could not afford them). Optional: an artifact trained before
# the rotations has none.
PLAIN = {"combined": "combined_plain", "signals": "signals_plain"}
PERM_PREFIX = "perm_"
# The same two for the cascade's "answer" judge: a free-form prompt's whole local answer read by
# its own figures (`routing/answer_figures.py`, `whole_inputs`). Optional, like the plain ones.
WHOLE = {"combined": "combined_answer", "signals": "signals_answer"}
LP_NAMES = ("lp_mean", "lp_min", "lp_q10", "lp_q25", "lp_q50")


def whole_inputs(head: Signals, whole: Signals | None) -> dict[str, float]:
    """The "answer" models' inputs: `head`, the figures over the answer's first tokens (what
    the other models read), with the log-probability summary over all the answer's tokens and
    the figures only `whole` has (`answer_figures.ANSWER_NAMES`) added. A multiple-choice prompt
    (its answer is a letter, judged by its head) or a missing `whole` leaves `head` as it is."""
    out = {k: math.nan if v is None else float(v) for k, v in head.items()}
    if whole is None or out.get("is_choice") == 1.0:
        return out
    for name, v in whole.items():
        if name in LP_NAMES or name not in head:
            out[name] = math.nan if v is None else float(v)
    return out


def judged_inputs(head: Signals, whole: Signals | None) -> dict[str, float] | None:
    """`whole_inputs` for a row the "answer" models can judge (multiple choice, or a free-form
    answer with its whole figures); None for a free-form row without them."""
    if whole is None and head.get("is_choice") != 1.0:
        return None
    return whole_inputs(head, whole)


def without_rotations(signals: Signals) -> bool:
    """A multiple-choice prompt whose option rotations were not measured."""
    v = signals.get("is_choice")
    if v is None or math.isnan(float(v)) or float(v) != 1.0:
        return False
    perm = [x for k, x in signals.items() if k.startswith(PERM_PREFIX)]
    return not perm or all(x is None or math.isnan(float(x)) for x in perm)


def extra_key(kind: str, head: str) -> str:
    """Where a stage-2 head's estimators sit in the router's skops file."""
    return f"stage2:{kind}:{head}"


def load(directory: Path, manifest: dict[str, Any]) -> dict[str, Stage2]:
    """The stage-2 models a router artifact holds ({} for a stage-1-only artifact), checked
    against the golden scores the manifest records; any problem is a RouterArtifactError."""
    from hybridllm.errors import RouterArtifactError
    from hybridllm.routing import artifact

    entry = manifest.get("stage2")
    if not entry:
        return {}
    mpath = directory / artifact.MANIFEST_FILE
    kinds = [*KINDS, *(k for k in (*PLAIN.values(), *WHOLE.values()) if k in entry)]
    keys = [extra_key(k, h) for k in kinds for h in HEADS]
    ests = artifact.load_extra(directory, manifest, keys)
    out: dict[str, Stage2] = {}
    try:
        for kind in kinds:
            spec = entry[kind]
            out[kind] = Stage2(
                signal_names=tuple(spec["signal_names"]),
                text_inputs=int(spec["text_inputs"]),
                mean=np.asarray(spec["mean"], dtype=np.float64),
                scale=np.asarray(spec["scale"], dtype=np.float64),
                heads={
                    h: head_from(
                        ests[extra_key(kind, h)]["classifier"],
                        ests[extra_key(kind, h)]["calibrator"],
                    )
                    for h in HEADS
                },
                calibration=Calibration.from_json(spec["calibration"]),
            )
        golden = entry["golden"]
        for kind, model in out.items():
            got = model.score(golden["text_logits"], golden["signals"])
            if not abs(got - float(golden["scores"][kind])) <= artifact.GOLDEN_TOLERANCE:
                raise ValueError(f"stage 2 ({kind}) scores {got!r}, recorded {golden['scores']}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RouterArtifactError(
            f"router stage 2 does not load ({exc})", path=mpath, reason="malformed"
        ) from exc
    return out


def router_score(
    router: Any,
    messages: Any,
    signals: Signals | None,
    cost_ms: float = 0.0,
    *,
    whole: bool = False,
    extra_ms: float = 0.0,
) -> RouterScore:
    """Combine stage 1 of `router` (a `Router`, or any scorer with `score`) with `signals`;
    `whole`: they are a whole answer's (`whole_inputs`), scored by the "answer" models when the
    artifact has them. `cost_ms`, `extra_ms`: the local work they took, and the part of it a
    local answer does not reuse (`RouterScore`)."""
    text = float(router.score(messages))
    models: dict[str, Stage2] = getattr(router, "stage2", {}) or {}
    if signals is None or not models:
        sig = {} if signals is None else {k: float("nan") if v is None else float(v)
                                          for k, v in signals.items()}  # fmt: skip
        return RouterScore(text, None, text, sig, cost_ms, extra_ms=extra_ms)
    from hybridllm.routing import features as F

    logits = router.head_logits(F.extract(messages))
    plain = without_rotations(signals) and all(k in models for k in PLAIN.values())
    whole = whole and not plain and all(k in models for k in WHOLE.values())
    use = PLAIN if plain else WHOLE if whole else {k: k for k in KINDS}
    local = models[use["signals"]].score((), signals)
    value = models[use["combined"]].score(logits, signals)
    clean = {k: float("nan") if v is None else float(v) for k, v in signals.items()}
    return RouterScore(text, local, value, clean, cost_ms, use["combined"], extra_ms)
