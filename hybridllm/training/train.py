"""Training the router: one deterministic command, a few seconds.

    hybridllm router train [--data data/router/labels.jsonl] [--out models/router]
                           [--from-log decisions.db]

Label (`--label`): "cloud-needed" (default), 1 when the local answer was wrong and the cloud's
right; or "local-wrong", 1 when the local answer was wrong. Form (`--form`, see `router.FORMS`):
"factored" (default for cloud-needed) trains two heads, cloud right and local right, and scores
P(cloud right) * (1 - P(local right)); "single" trains one head on the label itself. Each head
is an L2 logistic regression over the hashed n-grams and dense features of `features.extract`;
its regularisation C is chosen by 5-fold cross-validated ROC AUC on the train split alone, and
Platt scaling is then fitted on the calibration split. The router's scores on the calibration
split give the threshold quantiles and the quality curve. The test split is only scored, for
the manifest's metrics. The manifest also records the router's scores on `GOLDEN_PROMPTS` (its
`golden` entry): loading accepts any scikit-learn version that reproduces them.
Rows from a decision log (prompt stored, user feedback given, answered by the local engine) join
the train split.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from hybridllm.errors import ConfigError
from hybridllm.routing import features as F
from hybridllm.routing.heads import FORMS, Calibration, Head
from hybridllm.routing.labels import LABELS, Example, Label
from hybridllm.routing.router import Router
from hybridllm.training.data import (
    WHOLE_FILE,
    by_split,
    file_sha256,
    load_examples,
    load_signals,
    write_split_file,
)
from hybridllm.training.metrics import calibration_from_labelled, routing_curve, summarize
from hybridllm.training.save import save_router, weights_sha256

C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)
DEFAULT_LABEL: Label = "cloud-needed"
SEED = 0
SPLIT_FILE = "splits.tsv"


Form = Literal["single", "factored"]

# Fixed prompts of different kinds (arithmetic, code, trivia, multiple choice, yes/no, CJK,
# Cyrillic, a multi-turn chat with a system message and LaTeX), so that their scores touch the
# dense features and many hashed buckets of every head. The manifest records them with the
# trained router's scores; loading checks the loaded router reproduces those scores.
GOLDEN_PROMPTS: tuple[F.Messages, ...] = (
    "What is 417 * 23? Answer with the number only.",
    "Write a Python function that returns the n-th Fibonacci number.\n\n```python\n"
    "def fib(n):\n    ...\n```",
    "Who wrote the novel Moby-Dick?",
    "Which gas do plants absorb from the air?\nA) oxygen\nB) carbon dioxide\nC) nitrogen\n"
    "D) helium\nAnswer with the letter.",
    "Is the Pacific the largest ocean on Earth? Answer yes or no.",
    "東京タワーの高さは何メートルですか？",
    "Объясни, почему небо голубое.",
    [
        {"role": "system", "content": "You are a careful math tutor."},
        {"role": "user", "content": "Solve $x^2 - 5x + 6 = 0$."},
        {"role": "assistant", "content": "x = 2 or x = 3."},
        {"role": "user", "content": "Now solve \\frac{x}{3} + 2 = 14, step by step."},
    ],
)


def as_form(value: object) -> Form:
    """A router form checked against `router.FORMS` (a ConfigError otherwise)."""
    if value == "single":
        return "single"
    if value == "factored":
        return "factored"
    raise ConfigError(f"unknown router form {value!r}; known: {', '.join(FORMS)}")


def default_form(label: Label) -> Form:
    """Factored for cloud-needed (its heads learn from every row), single otherwise."""
    return "factored" if label == "cloud-needed" else "single"


@dataclass
class Fitted:
    router: Router
    estimators: dict[str, dict[str, Any]]  # per head: classifier, calibrator
    c: dict[str, float]  # per head
    cv_auc: dict[str, dict[float, float]]  # per head, per C


def feature_matrix(prompts: Sequence[F.Messages]) -> Any:
    """The sparse design matrix (rows: prompts; columns: hashed n-grams, then dense)."""
    from scipy.sparse import csr_matrix

    rows: list[npt.NDArray[np.int64]] = []
    cols: list[npt.NDArray[np.int64]] = []
    vals: list[npt.NDArray[np.float64]] = []
    dense_idx = np.arange(F.N_HASH, F.N_HASH + len(F.DENSE_NAMES), dtype=np.int64)
    for i, prompt in enumerate(prompts):
        f = F.extract(prompt)
        c = np.r_[f.hashed, dense_idx]
        v = np.r_[np.full(len(f.hashed), F.hashed_scale(len(f.hashed))), np.asarray(f.dense)]
        rows.append(np.full(len(c), i, dtype=np.int64))
        cols.append(c)
        vals.append(v)
    shape = (len(prompts), F.N_HASH + len(F.DENSE_NAMES))
    m = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape)
    m.sum_duplicates()
    return m


def _labels(examples: Sequence[Example], label: Label) -> npt.NDArray[np.int64]:
    return np.array([1 if ex.label(label) else 0 for ex in examples], dtype=np.int64)


def _head_labels(examples: Sequence[Example], head: str, label: Label) -> npt.NDArray[np.int64]:
    if head == "cloud_right":
        return np.array([int(ex.cloud_correct) for ex in examples], dtype=np.int64)
    if head == "local_right":
        return np.array([int(ex.local_correct) for ex in examples], dtype=np.int64)
    return _labels(examples, label)


def _model(c: float, seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, solver="liblinear", dual=True, max_iter=1000, random_state=seed)


def fit(
    train: Sequence[Example],
    calibration: Sequence[Example],
    *,
    label: Label = DEFAULT_LABEL,
    form: Form | None = None,
    seed: int = SEED,
) -> Fitted:
    """Fit each head (C by CV on `train`, Platt scaling on `calibration`)."""
    from threadpoolctl import threadpool_limits

    form = form or default_form(label)
    if form == "factored" and label != "cloud-needed":
        raise ConfigError(f"the factored form predicts cloud-needed, not {label!r}; use single")
    with threadpool_limits(1):  # extra BLAS threads only contend on problems this small
        return _fit(train, calibration, label, form, seed)


def _fit(
    train: Sequence[Example],
    calibration: Sequence[Example],
    label: Label,
    form: Form,
    seed: int,
) -> Fitted:
    x = feature_matrix([ex.prompt for ex in train])
    xc = feature_matrix([ex.prompt for ex in calibration])
    heads: dict[str, Head] = {}
    estimators: dict[str, dict[str, Any]] = {}
    chosen: dict[str, float] = {}
    cv: dict[str, dict[float, float]] = {}
    for name in FORMS[form]:
        y, yc = _head_labels(train, name, label), _head_labels(calibration, name, label)
        for part, labels in (("train", y), ("calibration", yc)):
            if len(set(labels.tolist())) < 2:
                what = name.replace("_", " ") if name != "label" else label
                raise ConfigError(f"the {part} split needs both values of {what!r}")
        heads[name], estimators[name], chosen[name], cv[name] = _fit_head(x, y, xc, yc, seed)
    router = Router(heads=heads, calibration=Calibration(score_quantiles=(0.0,), curve=()))
    scores = score_all(router, calibration)
    router.calibration = calibration_from_labelled(
        scores, [ex.local_correct for ex in calibration], [ex.cloud_correct for ex in calibration]
    )
    return Fitted(router, estimators, chosen, cv)


def _fit_head(
    x: Any,
    y: npt.NDArray[np.int64],
    xc: Any,
    yc: npt.NDArray[np.int64],
    seed: int,
) -> tuple[Head, dict[str, Any], float, dict[float, float]]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    folds = StratifiedKFold(n_splits=min(5, int(np.bincount(y).min())), shuffle=True,
                            random_state=seed)  # fmt: skip
    cv_auc: dict[float, float] = {}
    for c in C_GRID:
        model = _model(c, seed)
        cv_auc[c] = float(cross_val_score(model, x, y, cv=folds, scoring="roc_auc").mean())
    best = max(C_GRID, key=lambda c: (round(cv_auc[c], 6), -c))  # ties: stronger regularisation
    clf = _model(best, seed).fit(x, y)
    z = clf.decision_function(xc)
    platt = LogisticRegression(C=1e4, solver="lbfgs").fit(z.reshape(-1, 1), yc)
    head = Head(
        weights=np.asarray(clf.coef_, dtype=np.float64).ravel(),
        intercept=float(clf.intercept_[0]),
        platt=(float(platt.coef_[0, 0]), float(platt.intercept_[0])),
    )
    return head, {"classifier": clf, "calibrator": platt}, best, cv_auc


def oof_logits(
    router: Router, c: dict[str, float], rows: Sequence[Example], label: Label, seed: int
) -> npt.NDArray[np.float64]:
    """Each row's stage-1 head log-odds from heads fitted without it (5 folds, chosen C)."""
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    x = feature_matrix([e.prompt for e in rows])
    cols = []
    for head in router.heads:
        y = _head_labels(rows, head, label)
        folds = StratifiedKFold(5, shuffle=True, random_state=seed)
        cols.append(cross_val_predict(_model(c[head], seed), x, y, cv=folds,
                                      method="decision_function"))  # fmt: skip
    return np.asarray(np.c_[tuple(cols)], dtype=np.float64)


def golden(router: Router, prompts: Sequence[F.Messages] = GOLDEN_PROMPTS) -> dict[str, Any]:
    """The manifest's `golden` entry: fixed prompts and this router's scores for them."""
    as_json = [p if isinstance(p, str) else [dict(m) for m in p] for p in prompts]
    return {"prompts": as_json, "scores": [router.score(p) for p in prompts]}


def score_all(router: Router, examples: Sequence[Example]) -> npt.NDArray[np.float64]:
    return np.array([router.score(ex.prompt) for ex in examples], dtype=np.float64)


def _prob_metrics(
    scores: npt.NDArray[np.float64], examples: Sequence[Example], label: Label
) -> dict[str, float]:
    from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

    y = _labels(examples, label)
    if len(set(y.tolist())) < 2:
        return {"n": float(len(y))}
    return {
        "n": float(len(y)),
        "roc_auc": round(float(roc_auc_score(y, scores)), 4),
        "log_loss": round(float(log_loss(y, scores, labels=[0, 1])), 4),
        "brier": round(float(brier_score_loss(y, scores)), 4),
        "base_rate": round(float(y.mean()), 4),
    }


@dataclass
class Rows:
    """What one training reads: the labelled file's rows by split, and the decision log's."""

    examples: list[Example]  # the labelled file's rows
    splits: dict[str, list[Example]]  # the file's rows by split
    train: list[Example]  # the train split and the log's rows
    log_info: dict[str, Any] | None = None  # the manifest's "from_log"
    log_signals: dict[str, dict[str, float]] = field(default_factory=dict)
    log_whole: dict[str, dict[str, float]] = field(default_factory=dict)


def read_rows(data: Path, from_log: Path | str | None) -> Rows:
    """The labelled rows of `data` by split, with the feedback rows of a decision log (a path,
    `sqlite://PATH` or `redis://...`: `decision_log_from_url`) joining the train split (and the
    signals those rows recorded)."""
    examples = load_examples(data)
    splits: dict[str, list[Example]] = {k: v for k, v in by_split(examples).items()}
    rows = Rows(examples, splits, list(splits["train"]))
    if from_log is not None:
        from hybridllm.routing.logs import decision_log_from_url

        dlog = decision_log_from_url(from_log, argument="--from-log")
        try:
            extra = dlog.training_examples()
            rows.log_signals = dlog.training_signals()
            rows.log_whole = dlog.training_whole()
        finally:
            dlog.close()
        rows.train += extra
        rows.log_info = {**_log_source(from_log, extra), "rows": len(extra)}
    return rows


def _log_source(from_log: Path | str, extra: list[Example]) -> dict[str, Any]:
    """The manifest's record of the log learned from: an SQLite file's path and its hash; a
    Redis log's URL (no password) and the hash of the rows read (the log has no file)."""
    from hybridllm.routing.logs import sqlite_path
    from hybridllm.stores.redis_urls import redact_url

    path = sqlite_path(from_log, argument="--from-log")
    if path is not None:
        return {"path": str(path), "sha256": file_sha256(path)}
    read = [[e.id, e.prompt, e.local_correct] for e in extra]
    digest = hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()
    return {"url": redact_url(str(from_log)), "sha256": digest}


def train(
    data: Path,
    out: Path,
    *,
    from_log: Path | str | None = None,
    label: Label = DEFAULT_LABEL,
    form: Form | None = None,
    seed: int = SEED,
    log: TextIO | None = None,
    signals: Path | None = None,
) -> dict[str, Any]:
    """Train on `data` (+ feedback rows of a decision log), write the artifact to `out`.
    `signals`: the local model's signals per row (`scripts/label_local_signals.py`): stage 2
    is trained too (`training/stage2.py`), on them and on the log's rows that recorded signals."""
    rows = read_rows(data, from_log)
    form = form or default_form(label)
    fitted = fit(rows.train, rows.splits["calibration"], label=label, form=form, seed=seed)
    test = rows.splits["test"]
    test_metrics = _test_metrics(fitted.router, test, label)
    manifest = _manifest(data, rows, fitted, label, form, seed, test_metrics)
    extra_estimators: dict[str, Any] = {}
    if signals is not None:
        extra_estimators, manifest["stage2"] = _train_stage2(signals, rows, fitted, label, seed)
    full = save_router(out, fitted.estimators, manifest, extra_estimators)
    write_split_file(rows.examples, out / SPLIT_FILE)
    print(
        f"trained a {form} router on {len(rows.train)} rows (C={fitted.c}), calibrated on "
        f"{len(rows.splits['calibration'])}, test {len(test)}: "
        f"test ROC AUC {test_metrics.get('roc_auc')}, APGR {test_metrics.get('apgr')} -> {out}",
        file=log if log is not None else sys.stderr,
    )
    return full


def _test_metrics(router: Router, test: Sequence[Example], label: Label) -> dict[str, Any]:
    """The manifest's test figures: probability metrics, APGR, CPT and each engine's quality."""
    test_scores = score_all(router, test)
    out: dict[str, Any] = _prob_metrics(test_scores, test, label)
    if test:
        s = summarize(routing_curve(test_scores, [e.local_correct for e in test],
                                    [e.cloud_correct for e in test]))  # fmt: skip
        out.update(
            apgr=round(s.apgr, 4),
            cpt={f"{int(k * 100)}%": None if v is None else round(v, 4) for k, v in s.cpt.items()},
            q_local=round(s.q_weak, 4),
            q_cloud=round(s.q_strong, 4),
        )
    return out


def _manifest(
    data: Path,
    rows: Rows,
    fitted: Fitted,
    label: Label,
    form: Form,
    seed: int,
    test_metrics: dict[str, Any],
) -> dict[str, Any]:
    """The manifest of a trained stage 1 (`save_router` adds format, versions and hashes)."""
    r, examples, splits = fitted.router, rows.examples, rows.splits
    sources = sorted({e.source for e in examples})
    cal_scores = score_all(r, splits["calibration"])
    return {
        "label": label,
        "label_meaning": LABELS[label],
        "form": form,
        "score": (
            "P(label = 1), Platt-calibrated on the calibration split"
            if form == "single"
            else "P(cloud right) * (1 - P(local right)), each Platt-calibrated on the "
            "calibration split"
        ),
        "seed": seed,
        "data": {
            "file": data.name,
            "sha256": file_sha256(data),
            "rows": len(examples),
            "splits": {k: len(v) for k, v in splits.items()},
            "sources": {s: sum(e.source == s for e in examples) for s in sources},
            "from_log": rows.log_info,
        },
        "model": {
            "classifier": "LogisticRegression (L2, liblinear dual)",
            "C": fitted.c,
            "cv_roc_auc": {
                h: {str(k): round(v, 4) for k, v in auc.items()} for h, auc in fitted.cv_auc.items()
            },
            "weights_sha256": weights_sha256(r.heads),
        },
        "metrics": {
            "calibration": _prob_metrics(cal_scores, splits["calibration"], label),
            "test": test_metrics,
        },
        "calibration": r.calibration.to_json(),
        "golden": golden(r),
    }


def _signals_model(signals: Path) -> str | None:
    """The local model the signals were read on (the rows' "model"; one per file)."""
    with signals.open(encoding="utf-8") as fh:
        first = fh.readline()
    return str(json.loads(first).get("model")) if first.strip() else None


def _train_stage2(
    signals: Path, rows: Rows, fitted: Fitted, label: Label, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage 2 on the signals side file (and the whole answers' figures beside it, when
    labelled) plus the log's rows: (extra estimators, the manifest's "stage2" entry)."""
    from hybridllm.training.stage2 import train_stage2

    info = {"file": signals.name, "sha256": file_sha256(signals), "log_rows": len(rows.log_signals)}
    info["model"] = _signals_model(signals)  # a client warns when its local model is another
    whole_path = signals.with_name(WHOLE_FILE)  # the whole answers' figures, when labelled
    labelled = whole_path.is_file()
    whole = {**(load_signals(whole_path) if labelled else {}), **rows.log_whole}
    if whole:
        info["whole"] = {"file": whole_path.name if labelled else None,
                         "sha256": file_sha256(whole_path) if labelled else None,
                         "log_rows": len(rows.log_whole)}  # fmt: skip
    parts = {"train": rows.train, **{k: rows.splits[k] for k in ("calibration", "test")}}
    oof = oof_logits(fitted.router, fitted.c, rows.train, label, seed)
    extra, entry, _ = train_stage2(
        fitted.router,
        oof,
        parts,
        {**load_signals(signals), **rows.log_signals},
        data_info=info,
        whole=whole or None,
    )
    return extra, entry
