"""Stage-2 router variants against the shipped combination, under the same CV protocol.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/router_stage2_variants.py [--seeds 1]
        [--folds 5] [--no-loso] [--quick] [--only NAME,NAME] [--whole]

The protocol is `hybridllm/training/cv.py`'s: folds stratified by source, seeds 0..n-1, the
training rows' stage-1 log-odds out-of-fold (inner 5-fold), the held-out rows' from stage 1 fitted
on all training rows; then each source left out in turn (fitted on the others, seed 0). Every
variant sees the same folds and the same stage-1 log-odds. Printed per variant: mean APGR (sem over
folds x seeds), the spread of the per-seed means, CPT(80%), and the mean APGR over left-out
sources (with how many of the 13 it beats the shipped combination on).

Variants (each scores P(cloud right) * (1 - P(local right)) unless it says otherwise):
- stage 1: the text heads alone.
- combined (shipped): stage 2 as shipped, two logistic heads over [stage-1 log-odds, signals,
  answer-token figures x is_choice] (`training.stage2.fit_heads`).
- split: the local head over [stage-1 local log-odds, signals], the cloud head over [stage-1 cloud
  log-odds, signals]; split-sig: the local head over the signals alone.
- kind x sig: the shipped inputs plus the prompt's kind (choice / number / reasoning / code /
  open, read from the prompt's text as a runtime could) one-hot, and each signal times each kind.
- need: one logistic head on the joint label "local wrong and cloud right" over kind x sig.
- hgb: two HistGradientBoosting heads (depth 3) over [stage-1 log-odds, signals, kind].
- hgb+iso: the same, each head isotonic-calibrated (CalibratedClassifierCV, 3 folds).
- avg(comb,hgb): the mean of the shipped combination's and hgb's score ranks.
- combined C=0.05 / C=3: the shipped heads with another regularisation (shipped: C=0.3).
- combined, gain / hgb, gain / avg gain: ranked by P(cloud right) - P(local right), the expected
  quality gain of sending the row to the cloud, instead of the product.
- kind-z: the signals standardised within the prompt's kind (train-row means and scales), plus
  the kind one-hot, in the shipped logistic heads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import StratifiedKFold

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hybridllm.routing import stage2  # noqa: E402
from hybridllm.training import cv  # noqa: E402
from hybridllm.training.data import load_examples, load_signals, load_whole_inputs  # noqa: E402
from hybridllm.training.stage2 import design  # noqa: E402

KINDS = ("choice", "number", "reasoning", "code", "open")
HEADS = stage2.HEADS


def prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt)


def kind_of(text: str, is_choice: float) -> str:
    """The prompt's kind from its text (what a runtime can see): the answer format it asks for."""
    low = text.lower()
    if is_choice > 0.5 or "yes or no" in low:
        return "choice"
    if "```" in text or "def " in text:
        return "code"
    if "step by step" in low:
        return "reasoning"
    if "number only" in low or "answer: <number>" in low:
        return "number"
    return "open"


class Ctx:
    """Everything a variant may use for one split: raw inputs of the train and test rows."""

    def __init__(self, d: cv.Data, sig: np.ndarray, kind: np.ndarray, tr, te, zt_tr, zt_te):
        self.d, self.tr, self.te = d, tr, te
        self.sig_tr, self.sig_te = sig[tr], sig[te]
        self.k_tr, self.k_te = kind[tr], kind[te]
        self.zt_tr, self.zt_te = zt_tr, zt_te
        self.y = {h: d.y[h][tr] for h in HEADS}
        self.cache: dict[str, Any] = {}


def _logit_heads(
    xs: dict[str, tuple[np.ndarray, np.ndarray]], y: dict[str, np.ndarray], c: float = 0.3
) -> dict[str, np.ndarray]:
    """Per head: (train, test) design -> P(head) on test (logistic + Platt on the train rows, as
    `training.stage2.fit_heads` does with x = xc)."""
    from sklearn.linear_model import LogisticRegression

    out = {}
    for h, (a, b) in xs.items():
        mean, scale = a.mean(axis=0), a.std(axis=0)
        scale[scale < 1e-9] = 1.0
        a_s, b_s = (a - mean) / scale, (b - mean) / scale
        clf = LogisticRegression(C=c, max_iter=2000).fit(a_s, y[h])
        platt = LogisticRegression(C=1e4).fit(clf.decision_function(a_s).reshape(-1, 1), y[h])
        out[h] = platt.predict_proba(clf.decision_function(b_s).reshape(-1, 1))[:, 1]
    return out


def _product(p: dict[str, np.ndarray]) -> np.ndarray:
    return p["cloud_right"] * (1.0 - p["local_right"])


def _sigm(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _onehot(k: np.ndarray) -> np.ndarray:
    return np.stack([(k == name).astype(float) for name in KINDS], axis=1)


def _kind_x_sig(sig: np.ndarray, k: np.ndarray) -> np.ndarray:
    oh = _onehot(k)
    return np.concatenate([oh] + [sig * oh[:, [i]] for i in range(len(KINDS))], axis=1)


def v_stage1(c: Ctx) -> np.ndarray:
    return _sigm(c.zt_te[:, 0]) * (1 - _sigm(c.zt_te[:, 1]))


def v_combined(c: Ctx) -> np.ndarray:
    if "combined" not in c.cache:
        x = np.c_[np.clip(c.zt_tr, -20, 20), c.sig_tr]
        xt = np.c_[np.clip(c.zt_te, -20, 20), c.sig_te]
        p = _logit_heads({h: (x, xt) for h in HEADS}, c.y)
        c.cache["combined:p"] = p
        c.cache["combined"] = _product(p)
    return c.cache["combined"]


def v_split(c: Ctx) -> np.ndarray:
    zt, zte = np.clip(c.zt_tr, -20, 20), np.clip(c.zt_te, -20, 20)
    return _product(_logit_heads({
        "cloud_right": (np.c_[zt[:, :1], c.sig_tr], np.c_[zte[:, :1], c.sig_te]),
        "local_right": (np.c_[zt[:, 1:], c.sig_tr], np.c_[zte[:, 1:], c.sig_te]),
    }, c.y))  # fmt: skip


def v_split_sig(c: Ctx) -> np.ndarray:
    zt, zte = np.clip(c.zt_tr, -20, 20), np.clip(c.zt_te, -20, 20)
    return _product(_logit_heads({
        "cloud_right": (np.c_[zt, c.sig_tr], np.c_[zte, c.sig_te]),
        "local_right": (c.sig_tr, c.sig_te),
    }, c.y))  # fmt: skip


def _kx(c: Ctx) -> tuple[np.ndarray, np.ndarray]:
    x = np.c_[np.clip(c.zt_tr, -20, 20), c.sig_tr, _kind_x_sig(c.sig_tr, c.k_tr)]
    xt = np.c_[np.clip(c.zt_te, -20, 20), c.sig_te, _kind_x_sig(c.sig_te, c.k_te)]
    return x, xt


def v_kind(c: Ctx) -> np.ndarray:
    x, xt = _kx(c)
    return _product(_logit_heads({h: (x, xt) for h in HEADS}, c.y))


def v_need(c: Ctx) -> np.ndarray:
    x, xt = _kx(c)
    need = (c.y["cloud_right"] == 1) & (c.y["local_right"] == 0)
    return _logit_heads({"need": (x, xt)}, {"need": need.astype(int)})["need"]


def _hgb(iso: bool) -> Callable[[Ctx], np.ndarray]:
    def run(c: Ctx) -> np.ndarray:
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.ensemble import HistGradientBoostingClassifier

        key = f"hgb{iso}"
        if key in c.cache:
            return c.cache[key]
        x = np.c_[c.zt_tr, c.sig_tr, _onehot(c.k_tr)]
        xt = np.c_[c.zt_te, c.sig_te, _onehot(c.k_te)]
        p = {}
        for h in HEADS:
            m: Any = HistGradientBoostingClassifier(
                max_depth=3, learning_rate=0.05, max_iter=150, min_samples_leaf=40,
                l2_regularization=1.0, random_state=0,
            )  # fmt: skip
            if iso:
                m = CalibratedClassifierCV(m, method="isotonic", cv=3)
            p[h] = m.fit(x, c.y[h]).predict_proba(xt)[:, 1]
        c.cache[key + ":p"] = p
        c.cache[key] = _product(p)
        return c.cache[key]

    return run


def _gain(c: Ctx, key: str) -> np.ndarray:
    """The expected quality gain of sending a row to the cloud, P(cloud right) - P(local right),
    from the cached head probabilities of variant `key`."""
    p = c.cache[key + ":p"]
    return p["cloud_right"] - p["local_right"]


def v_combined_gain(c: Ctx) -> np.ndarray:
    v_combined(c)
    return _gain(c, "combined")


def v_hgb_gain(c: Ctx) -> np.ndarray:
    _hgb(False)(c)
    return _gain(c, "hgbFalse")


def v_avg_gain(c: Ctx) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v_combined_gain(c)) + rankdata(v_hgb_gain(c))


def _c_variant(cval: float) -> Callable[[Ctx], np.ndarray]:
    def run(c: Ctx) -> np.ndarray:
        x = np.c_[np.clip(c.zt_tr, -20, 20), c.sig_tr]
        xt = np.c_[np.clip(c.zt_te, -20, 20), c.sig_te]
        return _product(_logit_heads({h: (x, xt) for h in HEADS}, c.y, cval))

    return run


def _kind_z(c: Ctx) -> tuple[np.ndarray, np.ndarray]:
    """The signals standardised within each kind (means and scales of the train rows): how
    confident the local model is on this item compared with other items of its kind."""
    a, b = c.sig_tr.copy(), c.sig_te.copy()
    for k in KINDS:
        rows = c.k_tr == k
        if rows.sum() < 10:
            continue
        mean, scale = a[rows].mean(axis=0), a[rows].std(axis=0)
        scale[scale < 1e-9] = 1.0
        a[rows] = (a[rows] - mean) / scale
        b[c.k_te == k] = (b[c.k_te == k] - mean) / scale
    return a, b


def v_kind_z(c: Ctx) -> np.ndarray:
    a, b = _kind_z(c)
    x = np.c_[np.clip(c.zt_tr, -20, 20), a, _onehot(c.k_tr)]
    xt = np.c_[np.clip(c.zt_te, -20, 20), b, _onehot(c.k_te)]
    return _product(_logit_heads({h: (x, xt) for h in HEADS}, c.y))


def v_avg(c: Ctx) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v_combined(c)) + rankdata(_hgb(False)(c))


VARIANTS: dict[str, Callable[[Ctx], np.ndarray]] = {
    "stage 1": v_stage1,
    "combined (shipped)": v_combined,
    "split": v_split,
    "split-sig": v_split_sig,
    "kind x sig": v_kind,
    "need": v_need,
    "hgb": _hgb(False),
    "hgb+iso": _hgb(True),
    "avg(comb,hgb)": v_avg,
    "combined C=0.05": _c_variant(0.05),
    "combined C=3": _c_variant(3.0),
    "combined, gain": v_combined_gain,
    "hgb, gain": v_hgb_gain,
    "avg gain": v_avg_gain,
    "kind-z": v_kind_z,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data/router/labels.jsonl")
    ap.add_argument("--signals", type=Path, default=ROOT / "data/router/local_signals.jsonl")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--no-loso", action="store_true", help="skip leaving sources out")
    ap.add_argument("--quick", action="store_true", help="one seed, no sources left out (~15 s)")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    whole = "the whole-answer judge's inputs (as router_cv.py --stage2 --whole)"
    ap.add_argument("--whole", action="store_true", help=whole)
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.no_loso = 1, True
    names = [n for n in VARIANTS if not args.only or n in args.only.split(",")]
    t0 = time.perf_counter()
    load = load_whole_inputs if args.whole else load_signals
    d = cv.Data.build(load_examples(args.data), load(args.signals))
    sig = design(None, d.signals, d.names)
    ic = sig[:, d.names.index("is_choice")]
    kind = np.array([kind_of(prompt_text(e.prompt), ic[i]) for i, e in enumerate(d.examples)])
    local, cloud = d.y["local_right"], d.y["cloud_right"]
    figs = {n: cv.Figures() for n in names}
    per_seed: dict[str, list[float]] = {n: [] for n in names}
    for seed in range(args.seeds):
        start = {n: len(figs[n].apgr) for n in names}
        kf = StratifiedKFold(args.folds, shuffle=True, random_state=seed)
        for tr, te in kf.split(d.source, d.source):
            c = Ctx(
                d, sig, kind, tr, te, cv.oof_text_logits(d, tr, seed), cv.text_logits(d, tr, te)
            )
            for n in names:
                figs[n].add(VARIANTS[n](c), local[te], cloud[te])
        for n in names:
            per_seed[n].append(float(np.mean(figs[n].apgr[start[n] :])))
    loso: dict[str, dict[str, float]] = {n: {} for n in names}
    if not args.no_loso:
        for src in sorted(set(d.source.tolist())):
            te, tr = np.flatnonzero(d.source == src), np.flatnonzero(d.source != src)
            c = Ctx(d, sig, kind, tr, te, cv.oof_text_logits(d, tr, 0), cv.text_logits(d, tr, te))
            for n in names:
                f = cv.Figures()
                f.add(VARIANTS[n](c), local[te], cloud[te])
                if f.apgr:
                    loso[n][src] = f.apgr[0]
    kinds = {k: int((kind == k).sum()) for k in KINDS}
    print(f"{len(d.examples)} rows, {args.folds} folds x {args.seeds} seeds, stratified by source;"
          f" kinds {json.dumps(kinds)}")  # fmt: skip
    print(f"{'variant':<20} {'APGR':>5} {'sem':>8} {'seed spread':>11} CPT80  LOSO mean  wins")
    ref = loso.get("combined (shipped)", {})
    for n in names:
        f = figs[n]
        sem = np.std(f.apgr) / np.sqrt(len(f.apgr))
        spread = max(per_seed[n]) - min(per_seed[n])
        lo = f"{np.mean(list(loso[n].values())):9.3f}" if loso[n] else f"{'-':>9}"
        wins = sum(loso[n][s] > ref[s] for s in loso[n] if s in ref) if ref else 0
        print(f"{n:<20} {np.mean(f.apgr):.3f} +- {sem:.3f} {spread:11.3f} "
              f"{np.mean(f.cpt[0.8]):5.0%}  {lo}  {wins:>2}/{len(loso[n])}")  # fmt: skip
    if loso[names[0]]:
        print("\nleft-out sources, APGR:")
        print(f"{'source':<16}" + "".join(f"{n[:12]:>13}" for n in names))
        for src in sorted(loso[names[0]]):
            print(f"{src:<16}" + "".join(f"{loso[n].get(src, float('nan')):13.2f}" for n in names))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
