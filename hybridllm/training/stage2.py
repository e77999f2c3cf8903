"""Training router stage 2 beside stage 1 (`hybridllm router train --signals ...`); what it
trains is scored by `hybridllm.routing.stage2` (`scoring` here).

The training rows' stage-1 inputs are out-of-fold log-odds (5 folds, the heads' chosen C), the
calibration and test rows' are the fitted stage 1's. Both stage-2 models ("combined": stage-1
log-odds and signals; "signals": the signals alone) are fitted on the train split, Platt-scaled
and calibrated (score quantiles, quality curve) on the calibration split and scored on the test
split for the manifest. Rows without signals are left out of stage 2 only.

With the whole local answers' figures (`answer_signals.jsonl`, `scripts/label_local_signals.py
--whole`), two more models ("combined_answer", "signals_answer") learn to judge a whole answer
(the cascade's `cascade_judge = "answer"`), on `scoring.whole_inputs`: multiple-choice rows as the
others read them, free-form rows with their whole answer's figures; a free-form row without them
is left out of these two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm.routing import features as F, stage2 as scoring
from hybridllm.routing.heads import Calibration
from hybridllm.routing.labels import Example
from hybridllm.routing.router import Router
from hybridllm.routing.stage2 import (
    HEADS,
    DenseHead,
    Signals,
    head_from,
    interactions,
    signal_inputs,
)
from hybridllm.training.metrics import calibration_from_labelled, routing_curve, summarize

FloatArray = npt.NDArray[np.float64]
MIN_WHOLE = {"train": 30, "calibration": 10}  # whole answers the "answer" models need
# A fixed input the manifest records stage 2's scores for (loading checks them).
GOLDEN_SIGNALS = {
    "first_p": 0.42,
    "first_entropy": 1.7,
    "first_margin": 0.12,
    "lp_mean": -0.9,
    "lp_min": -2.3,
    "lp_q10": -2.0,
    "lp_q25": -1.4,
    "lp_q50": -0.6,
    "answer_tokens": 8.0,
    "option_p": math.nan,
    "option_entropy": math.nan,
    "is_choice": 0.0,
}


def design(
    text_logits: FloatArray | None, signals: Sequence[Signals], names: Sequence[str]
) -> FloatArray:
    """Rows of raw inputs (before scaling) for `fit_heads`."""
    sig = np.array([interactions(signal_inputs(s, names), names) for s in signals])
    if text_logits is None:
        return sig
    return np.asarray(np.c_[np.clip(text_logits, -20, 20), sig], dtype=np.float64)


def fit_heads(
    x: FloatArray,
    y: Mapping[str, npt.NDArray[np.int64]],
    xc: FloatArray,
    yc: Mapping[str, npt.NDArray[np.int64]],
    *,
    c: float = 0.3,
) -> tuple[FloatArray, FloatArray, dict[str, DenseHead], dict[str, dict[str, Any]]]:
    """Fit both heads on (x, y), Platt-scale on (xc, yc): (mean, scale, heads, estimators)."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    xs, xcs = (x - mean) / scale, (xc - mean) / scale
    heads: dict[str, DenseHead] = {}
    estimators: dict[str, dict[str, Any]] = {}
    for name in HEADS:
        clf = LogisticRegression(C=c, max_iter=2000).fit(xs, y[name])
        z = clf.decision_function(xcs)
        platt = LogisticRegression(C=1e4).fit(z.reshape(-1, 1), yc[name])
        heads[name] = head_from(clf, platt)
        estimators[name] = {"classifier": clf, "calibrator": platt}
    return mean, scale, heads, estimators


def _head_y(rows: Sequence[Example]) -> dict[str, npt.NDArray[np.int64]]:
    return {
        "cloud_right": np.array([e.cloud_correct for e in rows], dtype=np.int64),
        "local_right": np.array([e.local_correct for e in rows], dtype=np.int64),
    }


def _logits(router: Router, rows: Sequence[Example]) -> FloatArray:
    return np.array([router.head_logits(F.extract(e.prompt)) for e in rows], dtype=np.float64)


@dataclass
class Prepared:
    """Stage 2's rows by split (those with signals) and what every model of it reads."""

    part: dict[str, list[Example]]  # by split, the rows with signals
    z: dict[str, FloatArray]  # by split, stage 1's head log-odds (out of fold on "train")
    y: dict[str, dict[str, npt.NDArray[np.int64]]]  # "train", "calibration": labels per head
    base: dict[str, list[Signals]]  # by split, each row's signals
    judged: dict[str, dict[int, dict[str, float]]] | None  # the "answer" models' inputs
    names: tuple[str, ...]  # every signal name of the train rows
    plain: tuple[str, ...]  # the names without the option rotations'
    whole_names: tuple[str, ...] = ()  # the "answer" models' input names

    @property
    def kinds(self) -> list[str]:
        """The models to fit: always `KINDS`, the plain ones where the rotations were measured,
        the "answer" ones with enough whole answers."""
        kinds = [*scoring.KINDS, *(scoring.PLAIN.values() if self.plain != self.names else ())]
        return kinds if self.judged is None else [*kinds, *scoring.WHOLE.values()]


def prepare(
    router: Router,
    oof_logits: FloatArray,
    splits: dict[str, list[Example]],
    signals: dict[str, dict[str, float]],
    whole: dict[str, dict[str, float]],
) -> Prepared:
    """`train_stage2`'s rows and inputs (see there)."""
    keep = [i for i, e in enumerate(splits["train"]) if e.key in signals]
    part = {k: [e for e in v if e.key in signals] for k, v in splits.items()}
    names = tuple(sorted({k for e in part["train"] for k in signals[e.key]}))
    z = {
        "train": oof_logits[keep],
        "calibration": _logits(router, part["calibration"]),
        "test": _logits(router, part["test"]),
    }
    judged = _whole_rows(part, signals, whole)
    return Prepared(
        part=part,
        z=z,
        y={k: _head_y(part[k]) for k in ("train", "calibration")},
        base={k: [signals[e.key] for e in v] for k, v in part.items()},
        judged=judged,
        names=names,
        plain=tuple(n for n in names if not n.startswith(scoring.PERM_PREFIX)),
        whole_names=(
            ()
            if judged is None
            else tuple(sorted({k for v in judged["train"].values() for k in v}))
        ),
    )


def train_stage2(
    router: Router,
    oof_logits: FloatArray,
    splits: dict[str, list[Example]],
    signals: dict[str, dict[str, float]],
    *,
    data_info: dict[str, Any] | None = None,
    whole: dict[str, dict[str, float]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, scoring.Stage2]]:
    """(extra estimators for the skops file, the manifest's "stage2" entry, the models).
    `oof_logits`: stage 1's out-of-fold log-odds of every train row (`train.oof_logits`);
    `signals`: {"source/id": signals} (the labeller's side file, logged traffic); `whole`:
    {"source/id": the whole local answer's figures} (`answer_signals.jsonl`)."""
    prep = prepare(router, oof_logits, splits, signals, whole or {})
    extra: dict[str, Any] = {}
    models: dict[str, scoring.Stage2] = {}
    metrics: dict[str, Any] = {}
    for kind in prep.kinds:
        models[kind], ests, figures = fit_kind(prep, kind)
        for h, pair in ests.items():
            extra[scoring.extra_key(kind, h)] = pair
        if figures is not None:
            metrics[kind] = figures
    golden_z = [0.3, -0.8][: prep.z["train"].shape[1]]
    part, judged = prep.part, prep.judged
    entry = {
        "data": {
            **(data_info or {}),
            "rows": {k: len(v) for k, v in part.items()},
            # multiple-choice rows without their rotations: the plain models' only
            "without_rotations": sum(
                scoring.without_rotations(signals[e.key]) for e in part["train"]
            ),
            "whole_answers": None if judged is None else {k: len(v) for k, v in judged.items()},
        },
        **{kind: m.to_json() for kind, m in models.items()},
        "metrics": {"test": metrics},
        "golden": {
            "text_logits": golden_z,
            "signals": {k: (None if v != v else v) for k, v in GOLDEN_SIGNALS.items()},
            "scores": {k: m.score(golden_z, GOLDEN_SIGNALS) for k, m in models.items()},
        },
    }
    return extra, entry, models


def fit_kind(
    prep: Prepared, kind: str
) -> tuple[scoring.Stage2, dict[str, dict[str, Any]], dict[str, Any] | None]:
    """One stage-2 model: fitted on the train split, calibrated on the calibration split;
    (the model, its estimators, its test figures or None when no test row applies)."""
    use = kind.startswith("combined")
    is_plain = kind in scoring.PLAIN.values()
    rows = prep.judged if prep.judged is not None and kind in scoring.WHOLE.values() else None
    names = prep.plain if is_plain else prep.names if rows is None else prep.whole_names
    sig = (
        prep.base
        if rows is None
        else {k: [rows[k].get(i, {}) for i in range(len(v))] for k, v in prep.part.items()}
    )
    ok = {
        k: [i for i, v in enumerate(sig[k]) if _usable(rows, is_plain, k, i, v)]
        for k in ("train", "calibration")
    }
    zt, zc = prep.z["train"][ok["train"]], prep.z["calibration"][ok["calibration"]]
    st = [sig["train"][i] for i in ok["train"]]
    sc = [sig["calibration"][i] for i in ok["calibration"]]
    cal_k = [prep.part["calibration"][i] for i in ok["calibration"]]
    yt = {h: v[ok["train"]] for h, v in prep.y["train"].items()}
    yck = {h: v[ok["calibration"]] for h, v in prep.y["calibration"].items()}
    x = design(zt if use else None, st, names)
    xc = design(zc if use else None, sc, names)
    mean, scale, heads, ests = fit_heads(x, yt, xc, yck)
    text_inputs = prep.z["train"].shape[1] if use else 0
    uncalibrated = Calibration(score_quantiles=(0.0,), curve=())
    model = scoring.Stage2(names, text_inputs, mean, scale, heads, uncalibrated)
    cal_scores = [model.score(zr, v) for zr, v in zip(zc, sc, strict=True)]
    calib = calibration_from_labelled(
        cal_scores, [e.local_correct for e in cal_k], [e.cloud_correct for e in cal_k]
    )
    model = scoring.Stage2(names, model.text_inputs, mean, scale, heads, calib)
    keep_t = [i for i, v in enumerate(sig["test"]) if _usable(rows, is_plain, "test", i, v)]
    if not keep_t:
        return model, ests, None
    test = prep.part["test"]
    ts = [model.score(prep.z["test"][i], sig["test"][i]) for i in keep_t]
    s = summarize(
        routing_curve(
            ts, [test[i].local_correct for i in keep_t], [test[i].cloud_correct for i in keep_t]
        )
    )
    cpt = {f"{int(k * 100)}%": None if v is None else round(v, 4) for k, v in s.cpt.items()}
    return model, ests, {"apgr": round(s.apgr, 4), "cpt": cpt}


def _usable(
    rows: dict[str, dict[int, dict[str, float]]] | None,
    is_plain: bool,
    split: str,
    i: int,
    v: scoring.Signals,
) -> bool:
    """Whether row `i` of `split` (signals `v`) teaches a model: an "answer" model (`rows`
    given) only the rows with their whole answer's figures or multiple choice; a full model
    not the rows whose rotations were given up (logged cascades), which the plain ones learn."""
    if rows is not None:
        return i in rows[split]
    return is_plain or not scoring.without_rotations(v)


def _whole_rows(
    part: dict[str, list[Example]],
    signals: dict[str, dict[str, float]],
    whole: dict[str, dict[str, float]],
) -> dict[str, dict[int, dict[str, float]]] | None:
    """Per split, {row index: the "answer" models' inputs} of the rows they can learn from
    (multiple choice, or a free-form row with its whole answer's figures); None with fewer than
    `MIN_WHOLE` whole answers in the training split or in the calibration split."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for k, rows in part.items():
        judged = (scoring.judged_inputs(signals[e.key], whole.get(e.key)) for e in rows)
        out[k] = {i: v for i, v in enumerate(judged) if v is not None}
    for k in ("train", "calibration"):
        if sum(e.key in whole for e in part[k]) < MIN_WHOLE[k]:
            return None
    return out
