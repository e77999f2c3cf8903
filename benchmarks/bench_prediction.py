"""Prediction against outcome, the voice case of issue 25: does the latency model lock an engine
out?

    PYTHONPATH=$PWD python benchmarks/bench_prediction.py [--n 30] [--old /work/wt/old]
                                                          [--json PATH]

The voice preset as a new user builds it: the local engine Qwen2.5-Coder-0.5B (in process, one
thread) and a stand-in cloud SmolLM2-135M behind `hybridllm serve-model` on loopback (one thread; a
faster, weaker model: the case where a parallel cloud start wins every race). `--n` short voice
turns, greedy, 16 tokens each, one after another. For each request: the engine that served, the
TTFT predicted for it at the decision (`trace.predicted_ttft_ms`) against the TTFT measured,
whether the cloud started in parallel, and whether a cloud request was started and cancelled.

Reported per engine: the requests it served and the ratio predicted / measured TTFT (median and
P90, nearest rank); the local engine's prediction at the first and the last request; parallel
cloud starts and cancelled cloud requests. Rows: this checkout's rules, and, with `--old DIR`, a
checkout of earlier rules (e.g. `git worktree add /work/wt/old 2d555e5`) run the same way in a
subprocess (`PYTHONPATH=DIR`), in the same run.

Both engines share the machine's cores (2 here): they are given one thread each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOPICS = [
    "the weather on Mars", "a good name for a cat", "how tall Everest is", "what a haiku is",
    "the capital of Peru", "how to boil an egg", "why the sky is blue", "a fun fact about owls",
    "what time zone Tokyo is in", "how many legs a spider has", "a synonym for happy",
    "the speed of sound", "who wrote Hamlet", "what a prime number is", "a tip for sleeping well",
    "the boiling point of water", "how far the Moon is", "what rhymes with orange",
    "the largest ocean", "a quick stretch for the neck", "how bees make honey",
    "what DNA stands for", "a word for a group of crows", "the smallest planet",
    "how to say thanks in Japanese", "what a leap year is", "why leaves turn red",
    "a healthy snack", "how many bones adults have", "what causes thunder",
]  # fmt: skip
MAX_TOKENS = 16


def _pct(xs: list[float], q: float) -> float:
    """Nearest rank (`routing.hedging.quantile`); nan for none."""
    from hybridllm.routing.hedging import quantile

    return quantile(sorted(xs), q) if xs else math.nan


async def run_variant(n: int) -> dict[str, Any]:
    """One variant, in this process: whatever hybridllm PYTHONPATH gives."""
    from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing.hybrid_server import HybridServer

    rows = []
    with HybridServer(resolve_model("smollm2-135m-instruct", pull=True), alias="cloud",
                      api_key="sk-bench", n_ctx=2048, n_threads=1) as server:  # fmt: skip
        local = LlamaCppEngine("qwen2.5-coder-0.5b-instruct", n_ctx=2048, n_threads=1, pull=True)
        cloud = OpenAIEngine(base_url=server.base_url, api_key="sk-bench", model="cloud")
        async with HybridClient(local=local, cloud=cloud) as client:
            for i in range(n):
                prompt = f"In one sentence: {TOPICS[i % len(TOPICS)]}?"
                done = await client.complete(
                    prompt, policy="voice-assistant", max_tokens=MAX_TOKENS, temperature=0.0
                )
                tr = done.trace
                served = tr.engine
                rows.append({
                    "engine": served,
                    "ttft_ms": tr.ttft_ms,
                    "predicted_ms": dict(tr.predicted_ttft_ms or {}),
                    "parallel": tr.parallel_engine == "cloud",
                    "cancelled": "cloud" in tr.started and served not in (None, "cloud"),
                    "reason": tr.route_reason,
                })  # fmt: skip
    return {"rows": rows}


def summarise(name: str, res: dict[str, Any]) -> dict[str, Any]:
    rows = res["rows"]
    out: dict[str, Any] = {"variant": name, "requests": len(rows)}
    for engine in ("local", "cloud"):
        mine = [r for r in rows if r["engine"] == engine and r["ttft_ms"]]
        ratios = [r["predicted_ms"][engine] / r["ttft_ms"] for r in mine
                  if engine in r["predicted_ms"]]  # fmt: skip
        out[engine] = {
            "served": len(mine),
            "ratio_p50": _pct(ratios, 0.5),
            "ratio_p90": _pct(ratios, 0.9),
            "ttft_p50_ms": _pct([r["ttft_ms"] for r in mine], 0.5),
        }
    local_pred = [r["predicted_ms"].get("local") for r in rows]
    out["local_predicted_first_ms"] = local_pred[0] if local_pred else None
    out["local_predicted_last_ms"] = local_pred[-1] if local_pred else None
    out["parallel_cloud"] = sum(r["parallel"] for r in rows)
    out["cloud_cancelled"] = sum(r["cancelled"] for r in rows)
    return out


def render(summaries: list[dict[str, Any]], cpu: str) -> str:
    lines = [
        f"CPU: {cpu}; both engines share the cores, one thread each",
        "",
        "| rules | local served | local pred/actual p50 | p90 | cloud served | cloud pred/actual "
        "p50 | p90 | local predicted, first / last request | parallel cloud starts | cloud "
        "cancelled |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        lo, cl = s["local"], s["cloud"]
        lines.append(
            f"| {s['variant']} | {lo['served']}/{s['requests']} | {lo['ratio_p50']:.2f} | "
            f"{lo['ratio_p90']:.2f} | {cl['served']}/{s['requests']} | {cl['ratio_p50']:.2f} | "
            f"{cl['ratio_p90']:.2f} | {s['local_predicted_first_ms']:.0f} / "
            f"{s['local_predicted_last_ms']:.0f} ms | {s['parallel_cloud']} | "
            f"{s['cloud_cancelled']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--old", type=Path, help="a checkout of earlier rules, run alongside")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--variant-only", type=Path, help=argparse.SUPPRESS)  # a child's output
    args = ap.parse_args()
    import anyio

    if args.variant_only is not None:
        args.variant_only.write_text(json.dumps(anyio.run(run_variant, args.n)))
        return
    summaries = []
    variants: list[tuple[str, Path]] = [("this checkout", Path.cwd())]
    if args.old is not None:
        variants.append((f"old ({args.old.name})", args.old.resolve()))
    for name, root in variants:
        out = Path(f"/tmp/bench_prediction_{os.getpid()}_{len(summaries)}.json")
        env = {**os.environ, "PYTHONPATH": str(root)}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--n", str(args.n),
                        "--variant-only", str(out)], env=env, check=True, cwd=root)  # fmt: skip
        res = json.loads(out.read_text())
        summaries.append(summarise(name, res) | {"wall_s": time.perf_counter() - t0})
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    from benchmarks._report import cpu_model  # the parent's tree (a child may run an older one)

    cpu = cpu_model()
    print(render(summaries, cpu))
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu, "variants": summaries}, indent=1))


if __name__ == "__main__":
    main()
