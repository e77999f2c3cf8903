"""What router stage 2 costs, and what it is worth: the local work of the score and its APGR.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_router_score.py [-n 230]
        [--rotations-ms 300,1200] [--json rows.json]

Prompts: `-n` held-out labelled prompts (the test split of `models/router/splits.tsv`, which the
shipped router never trained or calibrated on), round-robin over the sources, in file order.
Local engine: Qwen2.5-Coder-0.5B (the model stage 2 was trained on), default threads. One pass
over the same prompts per variant, so no prompt finds itself in the KV cache (the chat
template's start does, as in real use):

- "always": the option rotations of every multiple-choice prompt (what `client.router_score()`
  reads without `rotations_ms=`, and the cascade read before `[cascade] rotations_ms`);
- "bounded N ms": what the cascade reads under a policy with `[cascade] rotations_ms = N` and
  the default hold (the rotations where what they add is priced at most N ms and they end
  inside the hold); 300 is the default.

Per variant: `cost` (all the local work of the score: the rotations, the prompt's prefill, the
8 held tokens), `extra` (the part of it a local answer that follows does not reuse: the
rotations but the question's prefill, which the prompt as asked finds cached), `cost where the
cloud serves` (the score above the threshold: all its work was for the decision), the share of
prompts whose rotations were read, APGR over the labels (the combined score ranks the prompts;
local-only and cloud-only quality are the labels'), and at the default threshold (30% to the
cloud): quality, the cloud share, and the decisions that agree with "always". No timed
assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

from hybridllm import LlamaCppEngine, Policy
from hybridllm.engines.llama.signals import option_letters
from hybridllm.routing import Router
from hybridllm.routing.stage2 import router_score
from hybridllm.runtime.plans.cascade import policy_cut, rotations_within
from hybridllm.training.data import load_examples
from hybridllm.training.metrics import apgr, routing_curve

ROOT = Path(__file__).resolve().parent.parent


def held_out(n: int) -> list[Any]:
    """`n` test-split examples, round-robin over the sources (each source's rows in file order)."""
    lines = (ROOT / "models/router/splits.tsv").read_text().splitlines()[1:]
    test = {f"{s}/{i}" for s, i, split in (x.split("\t") for x in lines) if split == "test"}
    by: dict[str, list[Any]] = defaultdict(list)
    for e in load_examples(ROOT / "data/router/labels.jsonl"):
        if e.key in test:
            by[e.source].append(e)
    out: list[Any] = []
    while len(out) < n and any(by.values()):
        for v in by.values():
            if v and len(out) < n:
                out.append(v.pop(0))
    return out


Rows = list[dict[str, Any]]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else math.nan


def line(name: str, xs: list[float]) -> str:
    return (f"  {name:<34} p50 {statistics.median(xs) if xs else math.nan:7.0f} ms  "
            f"p95 {pct(xs, 0.95):7.0f}  p99 {pct(xs, 0.99):7.0f}  (n={len(xs)})")  # fmt: skip


async def measure(
    local: LlamaCppEngine, router: Router, examples: list[Any], bound_ms: float | None
) -> list[dict[str, Any]]:
    hold_s = Policy(name="b").cascade.hold_ms / 1000.0
    kw: dict[str, Any] = {}
    if bound_ms is not None:
        kw = {"rotations_within_s": rotations_within(hold_s), "rotations_max_s": bound_ms / 1e3}
    rows = []
    for e in examples:
        msgs = [{"role": "user", "content": e.prompt}]
        t0 = time.perf_counter()
        sig = await local.signals(msgs, 8, **kw)
        s = router_score(router, msgs, sig.values, sig.cost_ms, extra_ms=sig.rotations_ms)
        heads_ms = (time.perf_counter() - t0) * 1e3 - sig.cost_ms  # queue hop + stage 1 + heads
        rotated = not math.isnan(s.signals.get("perm_p", math.nan))
        rows.append({"key": e.key, "mc": s.signals.get("is_choice") == 1.0, "rotated": rotated,
                     "cost_ms": s.cost_ms, "extra_ms": s.extra_ms, "other_ms": heads_ms,
                     "value": s.value, "model": s.model, "local_correct": e.local_correct,
                     "cloud_correct": e.cloud_correct})  # fmt: skip
    return rows


def report(name: str, rows: Rows, cut: float, base: Rows) -> None:
    cost = [r["cost_ms"] for r in rows]
    extra = [r["extra_ms"] for r in rows]
    cloud = [r["cost_ms"] for r in rows if r["value"] > cut]
    lc = [r["local_correct"] for r in rows]
    cc = [r["cloud_correct"] for r in rows]
    a = apgr(routing_curve([r["value"] for r in rows], lc, cc))
    to_cloud = [r["value"] > cut for r in rows]
    quality = statistics.mean(r["cloud_correct"] if c else r["local_correct"]
                              for r, c in zip(rows, to_cloud, strict=True))  # fmt: skip
    agree = statistics.mean((r["value"] > cut) == (b["value"] > cut)
                            for r, b in zip(rows, base, strict=True))  # fmt: skip
    mc = sum(r["mc"] for r in rows)
    print(f"{name}: rotations read on {sum(r['rotated'] for r in rows)} of {mc} "
          f"multiple-choice prompts")  # fmt: skip
    print(line("cost (all local work)", cost))
    print(line("extra (not reused by the answer)", extra))
    print(line("cost where the cloud serves", cloud))
    print(line("stage 1 + heads + queue hop", [r["other_ms"] for r in rows]))
    print(f"  APGR {a:.3f}; at the threshold {cut:.3f}: quality {quality:.3f}, cloud share "
          f"{statistics.mean(to_cloud):.1%}, decisions as 'always' {agree:.1%}")  # fmt: skip


async def run(n: int, bounds: list[float]) -> dict[str, Rows]:
    router = Router.load()
    local = LlamaCppEngine("qwen2.5-coder-0.5b-instruct", n_ctx=2048)
    examples = held_out(n)
    await local.start()
    out: dict[str, Rows] = {}
    try:
        await local.signals([{"role": "user", "content": "warm-up"}], 8)
        s = local.settings
        lq = statistics.mean(e.local_correct for e in examples)
        cq = statistics.mean(e.cloud_correct for e in examples)
        mc = sum(1 for e in examples if option_letters(e.prompt))
        print(f"local engine: {local.model}, threads {s and s.n_threads}; {len(examples)} "
              f"held-out prompts, {mc} multiple choice; local-only quality {lq:.3f}, "
              f"cloud-only {cq:.3f}")  # fmt: skip
        out["always"] = await measure(local, router, examples, None)
        for b in bounds:
            out[f"bounded {b:.0f} ms"] = await measure(local, router, examples, b)
    finally:
        await local.aclose()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=230, help="held-out prompts (default 230)")
    ap.add_argument("--rotations-ms", default="300", help="bounds to run, comma-separated")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    args = ap.parse_args()
    bounds = [float(x) for x in args.rotations_ms.split(",") if x.strip()]
    runs = anyio.run(run, args.n, bounds)
    cut = policy_cut(Router.load(), Policy(name="b"), "combined")
    for name, rows in runs.items():
        report(name, rows, cut, runs["always"])
    if args.json is not None:
        args.json.write_text(json.dumps(runs))
