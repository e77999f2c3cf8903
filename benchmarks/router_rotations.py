"""How many option rotations router stage 2 needs: the CV protocol of `router_cv.py --stage2`
over the same labelled rows, with the rotation figures recomputed from the labeller's stored
option probabilities for fewer rotations.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/router_rotations.py [--seeds 2]

`data/router/local_signals.jsonl` keeps, for each multiple-choice row, the option-letter
probabilities as asked ("options") and after each rotation ("rotated", by original option,
rotation 1 first). Variants, all else equal:
- none: no rotation figures (stage 2 as it was before them);
- rotations 1, 2: `option_rotations.summarise` over the first 1 or 2 rotations, what
  `ROTATIONS = 1` or `2` would measure;
- whole cycle: every rotation (3 for four options, 4 for five), the shipped setting;
- letter prior: no rotation, the option probabilities divided by the model's mean letter
  distribution over the labelled prompts with as many options (contextual calibration, Zhao et
  al. 2021: no extra prefill), as figures `cc_p`, `cc_agree`, `cc_margin`.
- debiased answer: not a router variant but another local answer. The local model answers a
  multiple-choice row with the option the whole cycle's mean probability ranks first (what the
  rotations already measured), so the row's `local_correct` is that option's; its figures are
  the whole cycle's around that option. Shows what answering this way would do to the local
  model's accuracy, to quality at 30% cloud and to APGR (whose gap it narrows).
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

from hybridllm.engines.llama.option_rotations import PERM_NAMES, summarise
from hybridllm.routing.labels import Example
from hybridllm.training import cv
from hybridllm.training.data import load_examples

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


def debiased(rows: list[Row], data: Path, examples: list[Example]) -> tuple[list[Example], Extra]:
    """The rows relabelled with the debiased answer (see the module's doc), and its figures."""
    from dataclasses import replace

    truth = {}
    for line in data.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            truth[f"{row['source']}/{row['id']}"] = str(row["answer"]).strip().upper()
    cycles = {f"{r['source']}/{r['id']}": [r["options"], *r["rotated"]]
              for r in rows if r.get("rotated")}  # fmt: skip
    out = [e if e.key not in cycles else replace(
        e, local_correct=chr(65 + int(np.argmax(np.mean(cycles[e.key], axis=0)))) == truth[e.key])
        for e in examples]  # fmt: skip

    def figures(r: Row) -> dict[str, float]:
        if not r.get("rotated"):
            return dict.fromkeys(PERM_NAMES, math.nan)
        probs = np.array([r["options"], *r["rotated"]], dtype=np.float64)
        mean = probs.mean(axis=0)
        choice = int(np.argmax(mean))
        return {"perm_agree": float(np.mean(probs.argmax(axis=1) == choice)),
                "perm_p": float(mean[choice]),
                "perm_margin": float(mean[choice] - np.delete(mean, choice).max())}  # fmt: skip

    return out, figures


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
    runs: list[tuple[str, list[Example], Extra]] = [
        (name, examples, extra) for name, extra in variants(rows).items()
    ]
    runs.append(("debiased answer", *debiased(rows, args.data, examples)))
    for name, labelled, extra in runs:
        d = cv.Data.build(labelled, signals(rows, extra))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cv.cross_validate(d, folds=5, seeds=args.seeds)
            cv.leave_sources_out(d)
        lines = buf.getvalue().splitlines()
        keep = [x for x in lines if x.startswith(("stage 1 ", "signals ", "combined ",
                                                   "ROC AUC", "mean "))]  # fmt: skip
        right = np.mean([e.local_correct for e in d.examples])
        choice = np.mean([e.local_correct for e, s in zip(d.examples, d.signals, strict=True)
                          if s.get("is_choice") == 1.0])  # fmt: skip
        print(f"== {name} (local right: {right:.3f} of all rows, {choice:.3f} of multiple choice)")
        print("\n".join("   " + x for x in keep), flush=True)


if __name__ == "__main__":
    main()
