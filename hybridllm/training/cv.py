"""Cross-validated figures of stage 1, the local signals alone and the combination (stage 2).

    hybridllm router eval --stage2 [--signals data/router/local_signals.jsonl]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/router_cv.py --stage2

Stratified by source, each fold fits on the others and scores the held-out rows:
- stage 1: the factored text router's two heads (fixed C, 3 for cloud right, 0.1 for local
  right, as benchmarks/router_cv.py), score P(cloud right) * (1 - P(local right));
- signals: stage 2's two heads over the local model's signals alone;
- combined: stage 2's heads over [stage-1 log-odds, signals]; the training rows' stage-1
  log-odds are out-of-fold (an inner 5-fold split), so stage 2 learns how far stage 1 holds on
  prompts it did not see;
- dataset oracle: knows each prompt's source, ranks sources by the cloud's gain there;
- local known: a bound, stage 1's P(cloud right) times whether the local answer really was
  wrong (what a perfect local-confidence signal could reach with stage 1's cloud head).
The ROC AUC of each method's P(local right) on the held-out rows is printed too: how well it
tells the local model's right answers from its wrong ones.
Then each source left out in turn: everything fitted on the other sources, scored on all of its
rows. APGR and CPT(50/80/95%) per fold are averaged (a CPT never reached counts as 100%).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm.routing.labels import Example
from hybridllm.routing.stage2 import HEADS
from hybridllm.training.metrics import CPT_TARGETS, routing_curve, summarize
from hybridllm.training.stage2 import design, fit_heads

C_TEXT = {"cloud_right": 3.0, "local_right": 0.1}
METHODS = ("stage 1", "signals", "combined", "dataset oracle", "local known", "random")
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class Data:
    examples: list[Example]
    x: Any  # sparse text design matrix
    signals: list[dict[str, float]]
    names: tuple[str, ...]
    y: dict[str, IntArray]
    source: npt.NDArray[np.str_]

    @classmethod
    def build(cls, examples: Sequence[Example], signals: dict[str, dict[str, float]]) -> Data:
        from hybridllm.training.train import feature_matrix

        rows = [e for e in examples if e.key in signals]
        sig = [signals[e.key] for e in rows]
        names = tuple(sorted({k for s in sig for k in s}, key=lambda k: (k != "is_choice", k)))
        y = {
            "cloud_right": np.array([e.cloud_correct for e in rows], dtype=np.int64),
            "local_right": np.array([e.local_correct for e in rows], dtype=np.int64),
        }
        x = feature_matrix([e.prompt for e in rows]).tocsr()
        return cls(rows, x, sig, names, y, np.array([e.source for e in rows]))


def _text_model(c: float) -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, solver="liblinear")


def text_logits(d: Data, tr: IntArray, te: IntArray) -> FloatArray:
    """Stage-1 head log-odds for rows `te`, fitted on rows `tr` (columns: cloud, local)."""
    cols = [_text_model(c).fit(d.x[tr], d.y[h][tr]).decision_function(d.x[te])
            for h, c in C_TEXT.items()]  # fmt: skip
    return np.asarray(np.c_[tuple(cols)], dtype=np.float64)


def oof_text_logits(d: Data, tr: IntArray, seed: int, folds: int = 5) -> FloatArray:
    """Out-of-fold stage-1 log-odds for every row of `tr`."""
    from sklearn.model_selection import StratifiedKFold

    out = np.zeros((len(tr), 2))
    inner = StratifiedKFold(folds, shuffle=True, random_state=seed + 1000)
    for a, b in inner.split(tr, d.source[tr]):
        out[b] = text_logits(d, tr[a], tr[b])
    return out


def _product(p_cloud: FloatArray, p_local: FloatArray) -> FloatArray:
    return np.asarray(p_cloud * (1.0 - p_local), dtype=np.float64)


def _sig(z: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


def scores(d: Data, tr: IntArray, te: IntArray, seed: int) -> dict[str, FloatArray]:
    """Every method's scores for rows `te`, fitted on rows `tr`; also, for stage 2's forms,
    each head's probabilities ("local:<form>", "cloud:<form>")."""
    zt = text_logits(d, tr, te)
    out = {"stage 1": _product(_sig(zt[:, 0]), _sig(zt[:, 1]))}
    out["local:stage 1"] = _sig(zt[:, 1])
    out["local known"] = _product(_sig(zt[:, 0]), d.y["local_right"][te].astype(np.float64))
    sig_tr = [d.signals[i] for i in tr]
    sig_te = [d.signals[i] for i in te]
    y = {h: v[tr] for h, v in d.y.items()}
    for name, ztr, zte in (
        ("signals", None, None),
        ("combined", oof_text_logits(d, tr, seed), zt),
    ):
        x, xt = design(ztr, sig_tr, d.names), design(zte, sig_te, d.names)
        mean, scale, heads, _ = fit_heads(x, y, x, y)
        xs = (xt - mean) / scale
        p = {h: np.array([heads[h].prob(r) for r in xs]) for h in HEADS}
        out[name] = _product(p["cloud_right"], p["local_right"])
        out[f"local:{name}"] = p["local_right"]
        out[f"cloud:{name}"] = p["cloud_right"]
    cloud, local = d.y["cloud_right"], d.y["local_right"]
    gain = {s: cloud[tr][d.source[tr] == s].mean() - local[tr][d.source[tr] == s].mean()
            for s in set(d.source[tr].tolist())}  # fmt: skip
    out["dataset oracle"] = np.array([gain.get(s, 0.0) for s in d.source[te]])
    out["random"] = np.zeros(len(te))  # all tied: the expected value of random routing
    return out


@dataclass
class Figures:
    apgr: list[float] = field(default_factory=list)
    cpt: dict[float, list[float]] = field(default_factory=lambda: {t: [] for t in CPT_TARGETS})
    q30: list[float] = field(default_factory=list)  # quality (share right) at 30% to the cloud

    def add(self, s: FloatArray, local: IntArray, cloud: IntArray) -> None:
        if local.sum() == cloud.sum():
            return
        curve = routing_curve(s, local.astype(bool), cloud.astype(bool))
        summary = summarize(curve)
        self.apgr.append(summary.apgr)
        self.q30.append(curve.quality_at(0.3))
        for t, v in summary.cpt.items():
            self.cpt[t].append(1.0 if v is None else v)

    def line(self, name: str) -> str:
        if not self.apgr:
            return f"{name:<16}   n/a"
        sem = np.std(self.apgr) / np.sqrt(len(self.apgr)) if len(self.apgr) > 1 else 0.0
        cpts = " ".join(f"{np.mean(self.cpt[t]):5.0%}" for t in CPT_TARGETS)
        return f"{name:<16} {np.mean(self.apgr):.3f} +- {sem:.3f} {cpts}  {np.mean(self.q30):.3f}"


def cross_validate(
    d: Data, *, folds: int = 5, seeds: int = 1, log: Callable[[str], None] = print
) -> dict[str, Figures]:
    """Stratified k-fold over all rows; also per source (pooled out-of-fold scores)."""
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold

    overall = {m: Figures() for m in METHODS}
    per_source: dict[str, dict[str, Figures]] = {}
    local, cloud = d.y["local_right"], d.y["cloud_right"]
    aucs: dict[str, list[float]] = {m: [] for m in METHODS[:3]}
    for seed in range(seeds):
        pooled = {m: np.zeros(len(d.examples)) for m in METHODS}
        kf = StratifiedKFold(folds, shuffle=True, random_state=seed)
        for tr, te in kf.split(d.source, d.source):
            for m, s in scores(d, tr, te, seed).items():
                if m.startswith("local:"):
                    aucs[m[6:]].append(float(roc_auc_score(local[te], s)))
                if ":" in m:  # a head's probabilities, not a method's scores
                    continue
                overall[m].add(s, local[te], cloud[te])
                pooled[m][te] = s
        for src in sorted(set(d.source.tolist())):
            rows = np.flatnonzero(d.source == src)
            figs = per_source.setdefault(src, {m: Figures() for m in METHODS})
            for m in METHODS:
                figs[m].add(pooled[m][rows], local[rows], cloud[rows])
    log(f"{len(d.examples)} rows, {folds} folds x {seeds} seeds, stratified by source")
    log(f"{'method':<16} {'APGR':>5} {'sem':>8} CPT50 CPT80 CPT95  quality at 30% cloud")
    for m in METHODS:
        log(overall[m].line(m))
    log("ROC AUC of P(local right): " + ", ".join(f"{m} {np.mean(v):.3f}" for m, v in aucs.items()))
    log("\nper source (out-of-fold scores pooled over folds):")
    log(f"{'source':<16} " + "  ".join(f"{m[:10]:>10}" for m in METHODS[:3]) + "   (APGR)")
    for src, figs in per_source.items():
        cells = "  ".join(
            f"{np.mean(figs[m].apgr):10.2f}" if figs[m].apgr else f"{'n/a':>10}"
            for m in METHODS[:3]
        )
        log(f"{src:<16} {cells}")
    return overall


def leave_sources_out(
    d: Data, sources: Sequence[str] | None = None, *, log: Callable[[str], None] = print
) -> dict[str, dict[str, Figures]]:
    """Each source left out in turn: fitted on the others, scored on all of its rows."""
    out: dict[str, dict[str, Figures]] = {}
    local, cloud = d.y["local_right"], d.y["cloud_right"]
    log("\nleft out of training (all rows of the source), APGR / CPT80:")
    log(f"{'source':<16} " + "  ".join(f"{m[:12]:>12}" for m in METHODS[:3]))
    for src in sources or sorted(set(d.source.tolist())):
        te = np.flatnonzero(d.source == src)
        tr = np.flatnonzero(d.source != src)
        figs = {m: Figures() for m in METHODS[:3]}
        for m, s in scores(d, tr, te, 0).items():
            if m in figs and local[te].sum() != cloud[te].sum():
                figs[m].add(s, local[te], cloud[te])
        out[src] = figs
        cells = "  ".join(
            f"{np.mean(f.apgr):5.2f} {np.mean(f.cpt[0.8]):5.0%}" if f.apgr else f"{'n/a':>12}"
            for f in figs.values()
        )
        log(f"{src:<16} {cells}")
    means = {m: [np.mean(out[s][m].apgr) for s in out if out[s][m].apgr] for m in METHODS[:3]}
    log(f"{'mean':<16} " + "  ".join(f"{np.mean(v):5.2f}{'':7}" for v in means.values()))
    return out
