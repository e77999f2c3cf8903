"""How many option rotations router stage 2 needs: the CV protocol of `router_cv.py --stage2`
over the same labelled rows, with the rotation figures recomputed from the labeller's stored
option probabilities for fewer rotations.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/router_rotations.py [--seeds 2]

`data/router/local_signals.jsonl` keeps, for each multiple-choice row, the option-letter
probabilities as asked ("options") and after each rotation ("rotated", by original option,
rotation 1 first). Variants, all else equal:
- none: no rotation figures (stage 2 as it was before them);
- rotations 1, 2: `_llama_perm.summarise` over the first 1 or 2 rotations, what
  `ROTATIONS = 1` or `2` would measure;
- whole cycle: every rotation (3 for four options, 4 for five), the shipped setting;
- letter prior: no rotation, the option probabilities divided by the model's mean letter
  distribution over the labelled prompts with as many options (contextual calibration, Zhao et
  al. 2021: no extra prefill), as figures `cc_p`, `cc_agree`, `cc_margin`.
Prints each variant's stage-2 APGR, CPT and AUC lines and its mean APGR over left-out sources.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm.engines._llama_perm import PERM_NAMES, summarise
from hybridllm.routing import cv
from hybridllm.routing.data import load_examples

ROOT = Path(__file__).resolve().parent.parent
Row = dict[str, Any]
Extra = Callable[[Row], dict[str, float]]


def letter_prior(rows: list[Row]) -> dict[int, np.ndarray]:
    by: dict[int, list[list[float]]] = {}
    for r in rows:
        if r.get("options"):
            by.setdefault(len(r["options"]), []).append(r["options"])
    return {k: np.mean(v, axis=0) for k, v in by.items()}


def variants(rows: list[Row]) -> dict[str, Extra]:
    prior = letter_prior(rows)
    nan = dict.fromkeys(PERM_NAMES, math.nan)

    def perm(n: int | None) -> Extra:
        def f(r: Row) -> dict[str, float]:
            if not r.get("options"):
                return nan
            return summarise(r["options"], (r.get("rotated") or [])[:n])

        return f

    def cc(r: Row) -> dict[str, float]:
        if not r.get("options"):
            return dict.fromkeys(("cc_p", "cc_agree", "cc_margin"), math.nan)
        o = np.array(r["options"])
        q = o / prior[len(o)]
        q = q / q.sum()
        c = int(np.argmax(o))
        return {"cc_p": float(q[c]), "cc_agree": float(int(np.argmax(q)) == c),
                "cc_margin": float(q[c] - np.delete(q, c).max())}  # fmt: skip

    return {"none": lambda r: {}, "rotations 1": perm(1), "rotations 2": perm(2),
            "whole cycle": perm(None), "letter prior": cc}  # fmt: skip


def signals(rows: list[Row], extra: Extra) -> dict[str, dict[str, float]]:
    out = {}
    for r in rows:
        sig = {k: math.nan if v is None else float(v) for k, v in r["signals"].items()
               if k not in PERM_NAMES}  # fmt: skip
        sig.update(extra(r))
        out[f"{r['source']}/{r['id']}"] = sig
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data/router/labels.jsonl")
    ap.add_argument("--signals", type=Path, default=ROOT / "data/router/local_signals.jsonl")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    examples = load_examples(args.data)
    rows = [json.loads(x) for x in args.signals.read_text().splitlines() if x.strip()]
    print(f"{len(examples)} rows, 5 folds x {args.seeds} seeds; stage 2 (combined) and the "
          "signals alone, then the mean APGR over left-out sources (stage 1 / signals / "
          "combined)")  # fmt: skip
    for name, extra in variants(rows).items():
        d = cv.Data.build(examples, signals(rows, extra))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cv.cross_validate(d, folds=5, seeds=args.seeds)
            cv.leave_sources_out(d)
        lines = buf.getvalue().splitlines()
        keep = [x for x in lines if x.startswith(("signals ", "combined ", "ROC AUC", "mean "))]
        print(f"== {name}")
        print("\n".join("   " + x for x in keep), flush=True)


if __name__ == "__main__":
    main()
