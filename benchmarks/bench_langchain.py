"""The LangChain adapter's figures (issue 30): LangChain's own first-token timing against the
trace's TTFT on the same requests, and cancellation to engine stop.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_langchain.py [--runs 8] [--max-tokens 32]
        [--repeats 5] [--threads 1] [--json out.json]

One process, one event loop: a `HybridClient` over the real local engine (Qwen2.5-Coder 0.5B,
greedy) and `HybridChatModel` over it. Every stamp is `hybridllm.clock.now()` (the loop's
monotonic clock, the one the trace reads). Printed:

- TTFT per request, P50 over runs: LangChain's (the app's `astream` call to the first
  `on_llm_new_token` callback with text, LangChain's own callback system, as a tracer such as
  LangSmith records it) and the trace's (`ttft_ms`: hybridllm's `stream()` call to the first
  token's delivery), and their difference (what LangChain and the adapter add around it);
- cancellation to engine stop: from `task.cancel()` on a task consuming `astream` (and, the
  other way, from `aclose()` of the generator) to the llama thread's last decode step
  (`LlamaCppEngine.stopped_at`), beside one decode step (the trace's TPOT). A closed generator
  waits for asyncio to finalise LangChain's inner generator (LangChain does not close it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import cpu_model, report  # noqa: E402

LOCAL = "qwen2.5-coder-0.5b-instruct"
ASK = "Write a Python function that checks if a number is prime."
COUNT = "Count from 1 to 300, separated by commas."


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def until(check: Any) -> None:
    """Poll `check` every millisecond (a flag the llama thread clears)."""
    while not check():  # noqa: ASYNC110 - observing an engine's state from outside
        await asyncio.sleep(0.001)


async def ttft_pairs(model: Any, runs: int) -> list[tuple[float, float]]:
    """(LangChain's first-token ms, the trace's ttft_ms) of each run, the same request."""
    from langchain_core.callbacks import AsyncCallbackHandler

    from hybridllm import clock

    class First(AsyncCallbackHandler):
        first: float | None = None

        async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            if token and self.first is None:
                self.first = clock.now()

    pairs = []
    for _ in range(runs):
        seen = First()
        t0 = clock.now()
        last = None
        async for chunk in model.astream(ASK, {"callbacks": [seen]}):
            last = chunk
        assert seen.first is not None and last is not None
        pairs.append(((seen.first - t0) * 1e3, last.response_metadata["ttft_ms"]))
    return pairs


async def cancel_to_stop(model: Any, local: Any, repeats: int) -> dict[str, list[float]]:
    """Milliseconds from the cancel (task) or the close (generator) to the engine's last step."""
    from hybridllm import clock

    out: dict[str, list[float]] = {"task.cancel()": [], "aclose()": []}
    for _ in range(repeats):
        first = asyncio.Event()

        async def consume(first: asyncio.Event = first) -> None:
            async for _ in model.astream(COUNT):
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        t = clock.now()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: not local.busy)
        out["task.cancel()"].append((local.stopped_at - t) * 1e3)

        chunks = model.astream(COUNT)
        await anext(chunks)
        t = clock.now()
        await chunks.aclose()
        await until(lambda: not local.busy)
        out["aclose()"].append((local.stopped_at - t) * 1e3)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from hybridllm import HybridClient, LlamaCppEngine
    from hybridllm.integrations.langchain import HybridChatModel
    from hybridllm.local.resolve import resolve_model

    path = resolve_model(LOCAL, pull=True)
    local = LlamaCppEngine(str(path), n_threads=args.threads, n_ctx=2048, warm_up=False)
    async with HybridClient(local=local, router=None) as client:
        base = HybridChatModel(client=client)
        model = base.bind(engine="local", max_tokens=args.max_tokens, temperature=0.0)
        await model.ainvoke("Say hi.")  # load and warm the model before any figure
        pairs = await ttft_pairs(model, args.runs)
        long = base.bind(engine="local", max_tokens=300, temperature=0.0)
        stops = await cancel_to_stop(long, local, args.repeats)
        probe = await model.ainvoke(ASK)
        tpot = probe.response_metadata["trace"]["tpot_ms"]
    return {
        "cpu": cpu_model(),
        "threads": args.threads,
        "runs": args.runs,
        "langchain_ttft_ms": [a for a, _ in pairs],
        "trace_ttft_ms": [b for _, b in pairs],
        "cancel_to_stop_ms": stops,
        "tpot_ms": tpot,
    }


def render(res: dict[str, Any]) -> str:
    lc, tr = res["langchain_ttft_ms"], res["trace_ttft_ms"]
    diffs = [a - b for a, b in zip(lc, tr, strict=True)]
    lines = [
        f"CPU: {res['cpu']} (local engine threads: {res['threads']})",
        f"TTFT, P50 of {res['runs']} runs: LangChain on_llm_new_token {p50(lc):.1f} ms, "
        f"trace ttft_ms {p50(tr):.1f} ms, LangChain - trace {p50(diffs):.2f} ms "
        f"(min {min(diffs):.2f}, max {max(diffs):.2f})",
        "per run (LangChain / trace ms): "
        + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(lc, tr, strict=True)),
    ]
    for how, ms in res["cancel_to_stop_ms"].items():
        lines.append(
            f"cancel to engine stop, {how}: P50 {p50(ms):.1f} ms, max {max(ms):.1f} ms "
            f"over {len(ms)} (one decode step: {res['tpot_ms']:.1f} ms)"
        )
    return "\n".join(lines)


def main() -> None:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5, help="cancellations of each kind")
    ap.add_argument("--threads", type=int, default=1, help="the local engine's threads")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    report(asyncio.run(main_async(args)), render, args.json)


if __name__ == "__main__":
    main()
