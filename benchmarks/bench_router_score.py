"""What router stage 2 costs: the local work of `router_score` and of the cascade's hold.

    /tmp/quiet.sh env PYTHONPATH=. .venv/bin/python benchmarks/bench_router_score.py [-n 40]

Prompts: `-n` labelled prompts (data/router/labels.jsonl), round-robin over the sources, seeded,
each used once (so no prompt finds itself in the KV cache; the chat template's start does, as in
real use). Local engine: Qwen2.5-Coder-0.5B (the model stage 2 was trained on), default threads.

1. `client.router_score(prompt)` with `hold` answer tokens (8, the policy default, and 4):
   `cost_ms` is the local work the score adds when the cloud then serves (prefill + the held
   tokens; when local serves, that work is its answer's start and is not repeated). The 8-token
   row runs again without the option rotations of multiple-choice prompts (the same prompts:
   what the rotations cost), and each row shows its multiple-choice prompts apart.
2. The cascade deferring every prompt (`router_threshold = 0`) to a cloud stand-in that answers
   at once (a scripted engine: what is measured is the hold, not a network): `trace.cascade
   .held_ms`, the time added before the cloud starts, and the TTFT.
3. The cascade releasing every prompt (`router_threshold = 1`) against plain local serving
   (`engine="local"`), on the two halves of another set of prompts: TTFT p50/p95.
No timed assertions.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict
from pathlib import Path

import anyio

from hybridllm import HybridClient, LlamaCppEngine, Policy
from hybridllm.engines.llama import signals as llama_signals
from hybridllm.engines.llama.signals import ROTATIONS
from hybridllm.routing import Router
from hybridllm.runtime.plans.cascade import score_messages
from hybridllm.testing import ScriptedEngine

ROOT = Path(__file__).resolve().parent.parent


def prompts(n: int, seed: int) -> list[str]:
    rows = [json.loads(x) for x in (ROOT / "data/router/labels.jsonl").read_text().splitlines()]
    by: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r["prompt"])
    rng = random.Random(seed)
    for v in by.values():
        rng.shuffle(v)
    out: list[str] = []
    while len(out) < n:
        for v in by.values():
            if v and len(out) < n:
                out.append(v.pop())
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def line(name: str, xs: list[float]) -> str:
    return (f"{name:<44} p50 {statistics.median(xs):7.0f} ms  p95 {pct(xs, 0.95):7.0f}  "
            f"p99 {pct(xs, 0.99):7.0f}  (n={len(xs)})")  # fmt: skip


async def main(n: int) -> None:
    router = Router.load()
    local = LlamaCppEngine("qwen2.5-coder-0.5b-instruct", n_ctx=2048)
    cloud = ScriptedEngine("cloud", tokens=["ok"], ttft_s=0.0)
    ps = prompts(4 * n, seed=1)
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        await client.router_score("warm-up")
        print(f"local engine: {local.model}, threads {local.settings and local.settings.n_threads}")
        for hold, part, rot in ((8, ps[:n], None), (8, ps[:n], 0), (4, ps[n : 2 * n], None)):
            llama_signals.ROTATIONS = rot if rot is not None else ROTATIONS
            cost, tokens, choice = [], [], []
            for p in part:
                s = await score_messages(router, local, [{"role": "user", "content": p}], hold)
                cost.append(s.cost_ms)
                tokens.append(local.count_tokens([{"role": "user", "content": p}]) or 0)
                if llama_signals.option_letters(p):
                    choice.append(s.cost_ms)
            name = f"router_score cost_ms, hold {hold} tokens" + (", no rotations" * (rot == 0))
            print(line(name, cost) + f"  prompt tokens p50 {statistics.median(tokens):.0f}")
            print(line("  of which multiple choice", choice))
        llama_signals.ROTATIONS = ROTATIONS
        pol = Policy(
            name="b",
            plans=("single", "hedge", "cascade"),
            sampling={"max_tokens": 16, "temperature": 0.0},
            routing={"router_threshold": 0.0},
            cascade={"hold_ms": 30000.0},
        )
        held, ttft = [], []
        for p in ps[2 * n : 3 * n]:
            r = await client.complete(p, policy=pol, plan="cascade")
            assert r.trace.cascade is not None, r.trace.route_reason
            assert r.trace.engine == "cloud", r.trace.cascade
            held.append(r.trace.cascade.held_ms or 0.0)
            ttft.append(r.trace.ttft_ms or 0.0)
        print(line("cascade defers: hold before the cloud starts", held))
        print(line("cascade defers: TTFT (cloud stand-in at 0 ms)", ttft))
        rel = pol.with_(routing={"router_threshold": 1.0})
        casc, plain = [], []
        for i, p in enumerate(ps[3 * n :]):
            if i % 2:
                r = await client.complete(p, policy=rel, plan="cascade")
                casc.append(r.trace.ttft_ms or 0.0)
            else:
                r = await client.complete(p, engine="local", max_tokens=16, temperature=0.0)
                plain.append(r.trace.ttft_ms or 0.0)
        print(line("cascade releases: TTFT", casc))
        print(line("plain local (engine='local'): TTFT", plain))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=40, help="prompts per measurement (default 40)")
    anyio.run(main, ap.parse_args().n)
