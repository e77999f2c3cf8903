"""Labeller v2: relabel the router data where v1's labels measured formatting, not knowledge.

v1 (`label_router_data.py`) generated free text and looked for the answer in it. Two kinds of
rows measured the wrong thing:

- Multiple choice (mc) got 8 tokens. The 1.5B model often starts to explain ("To determine the
  most likely ...") and never names a letter, so it counted as wrong though it knew the answer.
  v2 asks each model for exactly one token, constrained by a grammar to the option letters, at
  temperature 0: the model's answer is its most likely letter.
- gsm8k got 256 tokens. About half of the step-by-step answers were cut off before the final
  "Answer:" line. v2 continues each cut-off answer (greedy, so the same text v1 produced is the
  prefix) up to 512 tokens and scores the whole answer.

Every other row is copied unchanged. Each engine record gains "method" ("letter", "cont512" or
"v1"). Resumable: ids already in the output are skipped.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/relabel_router_v2.py \\
        --src data/router/labels.jsonl --out data/router/labels-v2.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from label_router_data import MODELS, Item, LetterModel, score  # type: ignore[import-not-found]

V1_CAP = 256
V2_CAP = 512


def relabel(row: dict[str, Any], models: dict[str, LetterModel]) -> dict[str, Any]:
    item = Item(row["source"], row["id"], row["prompt"], row["kind"], row["answer"], 0)
    out = dict(row)
    for key, model in models.items():
        rec = dict(row[key])
        if row["kind"] == "mc":
            letter, prompt_tokens, ms = model.letter(row["prompt"])
            rec.update(
                correct=letter == row["answer"],
                response=letter,
                prompt_tokens=prompt_tokens,
                completion_tokens=1,
                ttft_ms=round(ms, 1),
                tpot_ms=0.0,
                method="letter",
            )
        elif row["kind"] == "gsm8k" and rec["completion_tokens"] >= V1_CAP:
            tail, n = model.cont(row["prompt"], rec["response"], V2_CAP - rec["completion_tokens"])
            rec.update(
                response=rec["response"] + tail,
                completion_tokens=rec["completion_tokens"] + n,
                method="cont512",
            )
            rec["correct"] = score(item, rec["response"])
        else:
            rec["method"] = "v1"
        out[key] = rec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=Path("data/router/labels.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("data/router/labels-v2.jsonl"))
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    done = set()
    if args.out.exists():
        done = {(r["source"], r["id"]) for r in map(json.loads, args.out.open())}
    rows = [r for r in map(json.loads, args.src.open()) if (r["source"], r["id"]) not in done]
    # cheap rows first, so a partial run is still a full relabel of multiple choice
    rows.sort(key=lambda r: r["kind"] == "gsm8k")
    print(f"{len(done)} relabelled already, {len(rows)} to go", file=sys.stderr, flush=True)
    models = {key: LetterModel(name, args.threads) for key, name in MODELS.items()}
    letters: Counter[str] = Counter()
    t0 = time.time()
    for n, row in enumerate(rows, 1):
        new = relabel(row, models)
        letters.update(new[k]["response"] for k in models if new[k].get("method") == "letter")
        with args.out.open("a") as fh:
            fh.write(json.dumps(new, ensure_ascii=False) + "\n")
        if n % 50 == 0:
            rate = n / (time.time() - t0) * 3600
            print(
                f"{n}/{len(rows)}, {rate:.0f}/hour, letters {dict(letters)}",
                file=sys.stderr,
                flush=True,
            )


if __name__ == "__main__":
    main()
