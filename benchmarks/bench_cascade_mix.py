"""A mixed workload through the real engines: answer quality at a 30% cloud share (issue 14).

    /tmp/quiet.sh env PYTHONPATH=. .venv/bin/python benchmarks/bench_cascade_mix.py [-n 40]

Prompts: `-n` labelled prompts (data/router/labels.jsonl) with short gradeable answers (multiple
choice, yes/no, short phrase, arithmetic: gsm8k and code need hundreds of tokens), round-robin
over the sources, seeded. Each answer is graded by the labeller's own grader
(`scripts/label_router_data.py: score`) against the row's reference answer. The router was
trained on the labels' train split and calibrated on their calibration split, so by default
most of these prompts are in its training data: the figures are then an in-sample check of the
whole path (signals, thresholds, plans, engines). `--split test` draws the prompts from the
test split alone, which the shipped artifact never saw: a held-out estimate through the real
engines (the cross-validated one is `benchmarks/router_cv.py --stage2`).

`--kinds gsm8k,code,short,...` picks the kinds (gsm8k and code: long answers, the labels'
`max_tokens`, where the "cascade answer" row's whole-answer judge matters; their TTFT under
`complete()` is the whole answer's time for that row).

Engines: local Qwen2.5-Coder-0.5B through `LlamaCppEngine` (in process); the stand-in cloud
Qwen2.5-Coder-1.5B served by `hybridllm serve-model` (`HybridServer`) on loopback, through
`OpenAIEngine`. Temperature 0, short `max_tokens` per kind.

Three routers, each over all the prompts in its own pass (so no prompt finds itself in a KV
cache), every threshold calibrated the way the product does it, `target_cloud_share = 0.3` on
the shipped artifact's own calibration:
1. stage 1: the text router (policy `plans = ["single"]`).
2. cascade: `plan="cascade"` (stage 2: the text and the local model's first held tokens).
3. random: 30% of the prompts (a seeded draw of exactly that many) forced to the cloud.
4., 5. stage 1 and the cascade again with `router_threshold` set where exactly 30% of *this*
   workload's scores lie above it (its text scores; its combined scores from
   `client.router_score`, one extra local pass): quality at a matched share, when the product's
   calibration (on all the labelled sources, gsm8k and code included) misses 30% here.
6. with `--rows ...,"cascade answer"`: the cascade judging each whole local answer
   (`cascade_judge = "answer"`, `complete()`), at the product's threshold; `"cascade answer
   @30% here"`: the same with `router_threshold` where 30% of this workload's whole-answer
   scores lie above it (one more pass that keeps every local answer and reads the score the
   judge gave it, `trace.cascade.value`).
Reported: the share graded right, the actual cloud share (the engine that served), TTFT p50/p95,
and for the cascade rows which stage-2 model judged (`trace.cascade.model`: `combined_plain`
where the option rotations did not fit in the hold) or what ran instead (a race, a deadline).
No timed assertions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.local.resolve import resolve_model
from hybridllm.routing import Router
from hybridllm.testing import HybridServer
from hybridllm.training.data import split_of

ROOT = Path(__file__).resolve().parent.parent
LOCAL, CLOUD = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
KINDS = {"mc": 8, "yesno": 8, "number": 12, "short": 24}  # answer tokens per kind
LONG = {"gsm8k": 512, "code": 384}  # with --kinds: the labels' max_tokens
SHARE = 0.3


def _labeller() -> Any:
    """scripts/label_router_data.py, for its grader (`score`) and `Item`."""
    spec = importlib.util.spec_from_file_location(
        "label_router_data", ROOT / "scripts" / "label_router_data.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def workload(n: int, seed: int, split: str = "all") -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (ROOT / "data/router/labels.jsonl").read_text().splitlines()]
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] in KINDS and split in ("all", split_of(r["source"], str(r["id"]))):
            by[r["source"]].append(r)
    rng = random.Random(seed)
    for v in by.values():
        rng.shuffle(v)
    out: list[dict[str, Any]] = []
    while len(out) < n and any(by.values()):
        for v in by.values():
            if v and len(out) < n:
                out.append(v.pop())
    return out


def cut_at(scores: list[float], share: float) -> float:
    """A threshold with round(share * n) of `scores` above it: halfway between two scores, so
    stage 1 (`score >= threshold`: cloud) and the cascade (`score > threshold`) agree."""
    xs = sorted(scores)
    k = round(share * len(xs))
    if k == 0:
        return 1.0
    return 0.0 if k >= len(xs) else (xs[len(xs) - k - 1] + xs[len(xs) - k]) / 2


async def matched_policies(
    client: HybridClient, items: list[Any], base: Policy, casc: Policy
) -> dict[str, Policy]:
    """Stage 1's and the cascade's policies with `router_threshold` where 30% of this
    workload's scores (text; combined, from `client.router_score`) lie above it."""
    text, combined = [], []
    for it in items:
        score = await client.router_score(it.prompt)
        text.append(score.text)
        combined.append(score.value)
    here = {"stage 1": cut_at(text, SHARE), "cascade": cut_at(combined, SHARE)}
    print(f"thresholds putting {SHARE:.0%} of this workload above them: stage 1 "
          f"{here['stage 1']:.3f}, combined {here['cascade']:.3f}")  # fmt: skip
    return {k: p.with_(routing={"target_cloud_share": None, "router_threshold": c})
            for (k, c), p in zip(here.items(), (base, casc), strict=True)}  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


ROWS = ("stage 1", "cascade", "random", "stage 1 @30% here", "cascade @30% here")


async def main(n: int, seed: int, threads: int | None, runs: list[str], split: str) -> None:
    lab = _labeller()
    rows = workload(n, seed, split)
    print(f"{len(rows)} prompts from the {split} rows of data/router/labels.jsonl")
    items = [lab.Item(r["source"], r["id"], r["prompt"], r["kind"], r["answer"], KINDS[r["kind"]])
             for r in rows]  # fmt: skip
    router = Router.load()
    base = Policy(
        name="mix",
        plans=("single",),
        routing={"target_cloud_share": SHARE},
        sampling={"temperature": 0.0, "max_tokens": 24},
    )
    casc = base.model_copy(update={"plans": ("single", "cascade")})
    judged = casc.with_(cascade={"judge": "answer"})
    to_cloud = set(random.Random(seed + 1).sample(range(len(items)), round(SHARE * len(items))))
    t_start = time.perf_counter()
    with HybridServer(resolve_model(CLOUD, pull=True), alias="cloud", api_key="sk-bench",
                      n_ctx=2048, n_threads=threads) as server:  # fmt: skip
        local = LlamaCppEngine(LOCAL, n_ctx=2048, n_threads=threads, pull=True)
        cloud = OpenAIEngine(base_url=server.base_url, api_key="sk-bench", model="cloud")
        async with HybridClient(local=local, cloud=cloud, router=router) as client:
            for engine in ("local", "cloud"):  # warm-up (not measured)
                await client.complete("Say hi.", engine=engine, max_tokens=2, temperature=0.0)
            print(f"{len(items)} prompts: " + ", ".join(
                f"{k} {sum(it.kind == k for it in items)}" for k in KINDS))  # fmt: skip
            print(f"thresholds at target_cloud_share {SHARE}: stage 1 "
                  f"{router.threshold(cloud_share=SHARE):.3f}, " + ", ".join(
                      f"{k} {m.threshold(cloud_share=SHARE):.3f}" for k, m in router.stage2.items()
                      if k.startswith("combined")))  # fmt: skip
            matched = {}
            if any(r.endswith("here") for r in runs):
                matched = await matched_policies(client, items, base, casc)
            if "cascade answer @30% here" in runs:
                cut = {"target_cloud_share": None, "router_threshold": 1.0}
                keep = judged.with_(routing=cut)
                values = []
                for it in items:
                    r = await client.complete(it.prompt, policy=keep, plan="cascade",
                                              max_tokens=it.max_tokens)  # fmt: skip
                    values.append(float(r.trace.cascade.value))  # type: ignore[union-attr, arg-type]
                cut = cut_at(values, SHARE)
                print(f"whole-answer threshold putting {SHARE:.0%} of this workload above it: "
                      f"{cut:.3f}", flush=True)  # fmt: skip
                matched["cascade answer"] = keep.with_(routing={"router_threshold": cut})
            results: dict[str, list[tuple[bool, str, float, float]]] = {}
            judges: dict[str, Counter[str]] = {}
            for name in runs:
                got: list[tuple[bool, str, float, float]] = []
                judged_by = judges[name] = Counter()
                for i, it in enumerate(items):
                    kw: dict[str, Any] = {"max_tokens": it.max_tokens}
                    if name == "random":
                        kw.update(engine="cloud" if i in to_cloud else "local", temperature=0.0)
                    elif name.endswith("here"):
                        kind = name.split(" @")[0]
                        kw.update(policy=matched[kind])
                        if kind.startswith("cascade"):
                            kw.update(plan="cascade")
                    elif name == "cascade":
                        kw.update(policy=casc, plan="cascade")
                    elif name == "cascade answer":
                        kw.update(policy=judged, plan="cascade")
                    else:
                        kw.update(policy=base)
                    t0 = time.perf_counter()
                    r = await client.complete(it.prompt, **kw)
                    wall = (time.perf_counter() - t0) * 1e3
                    served: str = r.trace.engine or "?"
                    if r.trace.cascade is not None:  # which stage-2 model judged, or why none
                        c = r.trace.cascade
                        judged_by[str(c.model or f"no judgement ({c.decision})")] += 1
                    got.append((bool(lab.score(it, r.text)), served, r.trace.ttft_ms or 0.0, wall))
                results[name] = got
                print(f"  {name} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    print(f"\n{'router':<18} {'quality':>8} {'cloud share':>12} {'TTFT p50':>9} {'p95':>7}"
          f" {'total p50':>10} {'p95':>7}")  # fmt: skip
    for name, got in results.items():
        ttft, total = [t for _, _, t, _ in got], [w for _, _, _, w in got]
        print(f"{name:<18} {sum(c for c, _, _, _ in got) / len(got):8.3f} "
              f"{sum(e == 'cloud' for _, e, _, _ in got) / len(got):12.1%} "
              f"{statistics.median(ttft):7.0f}ms {pct(ttft, 0.95):5.0f}ms "
              f"{statistics.median(total):8.0f}ms {pct(total, 0.95):5.0f}ms")  # fmt: skip
    for name, got in results.items():
        for engine in ("local", "cloud"):
            part = [c for c, e, _, _ in got if e == engine]
            ttft = [t for _, e, t, _ in got if e == engine]
            if part:
                right, p50 = sum(part) / len(part), statistics.median(ttft)
                print(f"  {name:<18} served by {engine:<5}: {len(part):3d} prompts, "
                      f"right {right:.3f}, TTFT p50 {p50:.0f} ms")  # fmt: skip
    for name, judged_by in judges.items():
        if judged_by:
            print(f"  {name:<18} judged by: " + ", ".join(f"{k} {v}" for k, v in
                                                          judged_by.most_common()))  # fmt: skip
    lo = sum(r["local"]["correct"] for r in rows) / len(rows)
    hi = sum(r["cloud"]["correct"] for r in rows) / len(rows)
    print(f"labels for these prompts (multiple choice there: one grammar-constrained letter): "
          f"local alone {lo:.3f}, cloud alone {hi:.3f}")  # fmt: skip
    print(f"wall {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=40, help="prompts (default 40)")
    ap.add_argument("--quick", action="store_true", help="12 prompts")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--split", choices=("all", "test"), default="all",
                    help="draw the prompts from every labelled row, or from the test split "
                    "alone (held out from the shipped router)")  # fmt: skip
    ap.add_argument("--threads", type=int, help="llama.cpp threads per engine (default: all)")
    ap.add_argument("--kinds", help="the kinds of prompt, comma-separated (default: "
                    f"{','.join(KINDS)}; also {','.join(LONG)}: long answers)")  # fmt: skip
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"routers to run, of: {', '.join(ROWS)}, cascade answer, "
                    "cascade answer @30% here")  # fmt: skip
    a = ap.parse_args()
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = set(rows) - {*ROWS, "cascade answer", "cascade answer @30% here"}
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}")
    if a.kinds:
        every = {**KINDS, **LONG}
        wanted = [k.strip() for k in a.kinds.split(",") if k.strip()]
        if not wanted or set(wanted) - set(every):
            ap.error(f"--kinds: of {', '.join(every)}")
        KINDS = {k: every[k] for k in wanted}
    anyio.run(main, 12 if a.quick else a.n, a.seed, a.threads, rows, a.split)
