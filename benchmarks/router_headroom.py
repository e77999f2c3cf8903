"""Where stage 2's remaining gap lies: multiple-choice vs free-form rows, under cv.py's protocol.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/router_headroom.py [--seeds 1]
                                                                              [--whole]

Out of fold (5 folds stratified by source, stage 2 "combined" as `hybridllm/training/cv.py`
fits it), prints:
- the ROC AUC of stage 2's P(local right) on the multiple-choice rows and on the free-form rows;
- APGR with the local outcome known exactly on one kind of row (stage 2's P(local right) kept
  on the other), and on both: how much each kind could still give;
- APGR when one kind's P(local right) log-odds are moved towards the truth by `s` (+s if the
  local answer was right, -s if not), with the AUC that makes on those rows: how good a signal
  for that kind would have to be for a given APGR, the other kind's rows as they are.
`--whole`: the whole-answer judge's inputs (`training.data.load_whole_inputs`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold

from hybridllm.training import cv
from hybridllm.training.data import load_examples, load_signals, load_whole_inputs
from hybridllm.training.metrics import routing_curve, summarize

ROOT = Path(__file__).resolve().parent.parent
SHIFTS = (0.1, 0.2, 0.3, 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data/router/labels.jsonl")
    ap.add_argument("--signals", type=Path, default=ROOT / "data/router/local_signals.jsonl")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--whole", action="store_true", help="the whole-answer judge's inputs")
    args = ap.parse_args()
    load = load_whole_inputs if args.whole else load_signals
    d = cv.Data.build(load_examples(args.data), load(args.signals))
    local, cloud = d.y["local_right"], d.y["cloud_right"]
    mc = np.array([s.get("is_choice") == 1.0 for s in d.signals])
    out: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    for seed in range(args.seeds):
        kf = StratifiedKFold(5, shuffle=True, random_state=seed)
        for tr, te in kf.split(d.source, d.source):
            fitted = cv.scores(d, tr, te, seed)
            pc, pl = fitted["cloud:combined"], fitted["local:combined"]
            y, m = local[te], mc[te]

            def apgr(p_local: np.ndarray, pc: np.ndarray = pc, te: np.ndarray = te) -> float:
                s = pc * (1.0 - p_local)
                return summarize(routing_curve(s, local[te] == 1, cloud[te] == 1)).apgr

            add("AUC of P(local right), multiple choice", roc_auc_score(y[m], pl[m]))
            add("AUC of P(local right), free-form", roc_auc_score(y[~m], pl[~m]))
            add("APGR, stage 2 as fitted", apgr(pl))
            add("APGR, local outcome known on free-form rows", apgr(np.where(m, pl, y)))
            add("APGR, local outcome known on multiple-choice rows", apgr(np.where(m, y, pl)))
            add("APGR, local outcome known on every row", apgr(y.astype(np.float64)))
            z = np.log(pl / (1.0 - pl))
            for s in SHIFTS:
                moved = 1.0 / (1.0 + np.exp(-(z + s * (2 * y - 1))))
                for kind, rows in (("free-form", ~m), ("multiple choice", m)):
                    add(f"{kind} shifted by {s}: their AUC", roc_auc_score(y[rows], moved[rows]))
                    add(f"{kind} shifted by {s}: APGR", apgr(np.where(rows, moved, pl)))
    print(f"{len(d.examples)} rows ({int(mc.sum())} multiple choice), 5 folds x {args.seeds} "
          f"seeds{', whole-answer inputs' if args.whole else ''}")  # fmt: skip
    for name, v in out.items():
        print(f"{name:<52} {np.mean(v):.3f}")


if __name__ == "__main__":
    main()
