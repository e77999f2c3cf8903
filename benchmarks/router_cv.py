"""Cross-validated APGR of the router's forms against bounds, over all labelled rows.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/router_cv.py [--data data/router/labels.jsonl]
                                                               [--folds 5] [--seeds 2] [--stage2]

`--stage2`: stage 1, the local model's signals alone and the combination (router stage 2), see
`hybridllm/training/cv.py`; needs data/router/local_signals.jsonl (scripts/label_local_signals.py).
`--stage2 --whole`: the same for the cascade's "answer" judge, stage 2 on `stage2.whole_inputs`
(free-form rows read by their whole local answer, data/router/answer_signals.jsonl from
`label_local_signals.py --whole`; multiple-choice rows as before); free-form rows without the
whole answer's figures are left out, and so is every row of a source not in `--sources`.

Stratified by source, each fold fits on the others and scores the held-out rows:
- factored: two logistic regressions (P(cloud right), P(local right)) over the router's
  features, score P(cloud right) * (1 - P(local right)); fixed C (3 and 0.1), no Platt step
  (it does not change the ranking).
- factored, gain: the same heads, ranked by P(cloud right) - P(local right).
- single: one logistic regression on the joint label "cloud needed".
- length-only: the prompt's approximate token count (its log, the first dense feature).
- dataset oracle: knows each prompt's source and ranks sources by the cloud's gain there (cloud
  minus local accuracy on the training folds). A router of text features that reaches it does
  what knowing the dataset does; beyond it lies telling easy from hard items inside a dataset.
Prints mean APGR with its standard error over folds x seeds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from hybridllm.routing import features
from hybridllm.training.data import load_examples
from hybridllm.training.metrics import routing_curve, summarize
from hybridllm.training.train import feature_matrix

ROOT = Path(__file__).resolve().parent.parent
Scorer = Callable[[np.ndarray, np.ndarray], np.ndarray]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data/router/labels.jsonl")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--stage2", action="store_true",
                    help="stage 1 vs the local signals alone vs combined (hybridllm.training.cv), "
                    "per source and with each source left out")  # fmt: skip
    ap.add_argument("--signals", type=Path, default=ROOT / "data/router/local_signals.jsonl")
    ap.add_argument("--whole", action="store_true", help="judge free-form rows by the whole "
                    "local answer (data/router/answer_signals.jsonl)")  # fmt: skip
    ap.add_argument("--sources", help="only these sources (comma-separated)")
    args = ap.parse_args()
    examples = load_examples(args.data)
    if args.sources:
        examples = [e for e in examples if e.source in args.sources.split(",")]
    if args.stage2:
        from hybridllm.training import cv
        from hybridllm.training.data import load_signals, load_whole_inputs

        load = load_whole_inputs if args.whole else load_signals
        d = cv.Data.build(examples, load(args.signals))
        cv.cross_validate(d, folds=args.folds, seeds=args.seeds)
        cv.leave_sources_out(d)
        return
    x = feature_matrix([e.prompt for e in examples]).tocsr()
    length = x[:, features.N_HASH].toarray().ravel()  # first dense feature: log token count
    local = np.array([e.local_correct for e in examples])
    cloud = np.array([e.cloud_correct for e in examples])
    need = ~local & cloud
    source = np.array([e.source for e in examples])

    def heads(tr: np.ndarray, te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pc = LogisticRegression(C=3.0, solver="liblinear").fit(x[tr], cloud[tr])
        pl = LogisticRegression(C=0.1, solver="liblinear").fit(x[tr], local[tr])
        return pc.predict_proba(x[te])[:, 1], pl.predict_proba(x[te])[:, 1]

    def factored(tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        c, lo = heads(tr, te)
        return c * (1 - lo)

    def gain(tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        c, lo = heads(tr, te)
        return c - lo

    def single(tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        model = LogisticRegression(C=1.0, solver="liblinear").fit(x[tr], need[tr])
        return np.asarray(model.decision_function(x[te]))

    def oracle(tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        by = {s: cloud[tr][source[tr] == s].mean() - local[tr][source[tr] == s].mean()
              for s in set(source[tr])}  # fmt: skip
        return np.array([by.get(s, 0.0) for s in source[te]])

    scorers: dict[str, Scorer] = {
        "factored": factored,
        "factored, gain": gain,
        "single": single,
        "length-only": lambda tr, te: length[te],
        "dataset oracle": oracle,
    }
    print(f"{len(examples)} rows, {args.folds} folds x {args.seeds} seeds, stratified by source")
    for name, scorer in scorers.items():
        apgrs = []
        for seed in range(args.seeds):
            folds = StratifiedKFold(args.folds, shuffle=True, random_state=seed)
            for tr, te in folds.split(length, source):
                curve = routing_curve(scorer(tr, te), local[te], cloud[te])
                apgrs.append(summarize(curve).apgr)
        sem = np.std(apgrs) / np.sqrt(len(apgrs))
        print(f"{name:<16} APGR {np.mean(apgrs):.3f} +- {sem:.3f}")


if __name__ == "__main__":
    main()
