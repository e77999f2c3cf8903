"""What opening a client costs: `async with HybridClient(...)` with the local engine and a cloud,
the shipped router loaded (the default) against none (`router=None`), each in a fresh
interpreter, alternating; then a first request (a name in it: its privacy scan needs the NER
pipelines), its first token timed from the same start, and the time between its next pieces
(up to 24 tokens).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_open.py [--runs N] [--model NAME]

The cloud is a scripted engine (opening it costs nothing), so the figure is the local engine's
start, the router's load and what runs beside them (the privacy scan's NER pipelines start
loading on a thread as the cloud's guard opens). Prints each run's seconds and whether the
router's load imported scikit-learn. No timed assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from benchmarks._report import cpu_model

CHILD = """
import json, sys, time, anyio
from hybridllm import HybridClient, LlamaCppEngine, Policy
from hybridllm.engines.scripted import ScriptedEngine

async def main():
    kw = {} if sys.argv[1] == "default" else {"router": None}
    local = LlamaCppEngine(sys.argv[2], n_ctx=2048)
    t = time.perf_counter()
    async with HybridClient(local=local, cloud=ScriptedEngine("cloud", tokens=["c"]), **kw) as c:
        opened = time.perf_counter() - t
        first, n = None, 0
        cloud_first = Policy(name="cloud-first", routing={"prefer": "cloud"})
        pol = cloud_first if sys.argv[3] == "cloud" else None
        async with c.stream("Say hello to Marie Curie.", max_tokens=24, policy=pol) as s:
            async for _ in s:
                n += 1
                first = first or time.perf_counter() - t
        last = time.perf_counter() - t
        tpot = (last - first) / max(n - 1, 1)
        print(json.dumps({"open_s": opened, "first_s": first, "tpot_s": tpot, "by": s.trace.engine,
                          "router": c.routing.router is not None,
                          "sklearn": "sklearn" in sys.modules}))

anyio.run(main)
"""


def one(arm: str, model: str, prefer: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, arm, model, prefer],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prefer", choices=["default", "cloud"], default="default",
                        help="the first request's policy: the client's, or one preferring the "
                        "cloud (its privacy scan waits for the NER pipelines)")  # fmt: skip
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {"default": [], "none": []}
    print(f"opening a client: {args.model} and a scripted cloud, CPU {cpu_model()}")
    for _ in range(args.runs):
        for arm in seconds:
            r = one(arm, args.model, args.prefer)
            seconds[arm].append(float(r["open_s"]))  # type: ignore[arg-type]
            print(f"  router {arm:<8} open {r['open_s']:.2f} s, a first request's first token "
                  f"{r['first_s']:.2f} s from the start, then {1e3 * r['tpot_s']:.0f} ms a piece "
                  f"({r['by']}; router loaded: {r['router']}, "
                  f"scikit-learn imported: {r['sklearn']})")  # fmt: skip
    for arm, xs in seconds.items():
        print(f"router {arm}: median {statistics.median(xs):.2f} s over {len(xs)} runs")


if __name__ == "__main__":
    main()
