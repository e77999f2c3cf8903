"""Cloud concurrency: a burst of concurrent requests against a cloud concurrency limit, with a
deadline.

    python benchmarks/bench_cloud_limit.py [--n 32] [--quick] [--limit 4] [--deadline-ms 1000]
                                           [--max-tokens 24] [--json PATH]

The "cloud" is the real `llama_cpp.server` (SmolLM2-135M, one thread, `interrupt_requests` off
so it queues requests as a provider does rather than dropping the running one) on loopback; the
local engine is `LlamaCppEngine` with SmolLM2-135M too (one thread). `--n` requests start at
once under `Policy(prefer="cloud", ttft_deadline_ms=D)`, short prompts, greedy, `--max-tokens`
tokens. After three warm-up requests on each engine (the latency model and the slot hold time
are learned, as in a running app), two rows, each on a fresh client:

- no limit: every request goes to the cloud at once; the server queues them where the client
  cannot see it, and the deadline race starts the local engine for those that miss;
- limit: `OpenAIEngine(max_concurrency=L)`: requests past the limit wait in the client's queue,
  whose forecast routing reads, so a request the queue would make miss its deadline goes to the
  local engine up front (the route says "cloud queue ... -> local").

Reported: TTFT P50/P90/P99 (from the call to the first token in the app), deadline misses, the
engine that served, and how many were routed local by the cloud queue.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import LlamaServer

API_KEY = "sk-bench"
ALIAS = "cloud"
MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "Name a color.",
    "What is 3 times 4?",
    "Say hello in Spanish.",
    "Name a fruit.",
    "What day comes after Monday?",
    "Give me a word that rhymes with cat.",
    "What is the capital of France?",
    "Name an animal that can fly.",
]


@dataclass
class Row:
    name: str
    ttft_ms: list[float] = field(default_factory=list)
    engines: dict[str, int] = field(default_factory=dict)
    misses: int = 0
    queue_routed: int = 0
    errors: int = 0

    def pct(self, q: float) -> float:
        xs = sorted(self.ttft_ms)
        if not xs:
            return math.nan
        return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


async def run(path: Path, base_url: str, limit: int | None, args: argparse.Namespace) -> Row:
    row = Row("no limit" if limit is None else f"limit {limit}")
    cloud = OpenAIEngine(base_url=base_url, api_key=API_KEY, model=ALIAS, max_concurrency=limit)
    local = LlamaCppEngine(path, n_ctx=1024, n_threads=1)
    policy = Policy(name="burst", routing={"prefer": "cloud", "ttft_deadline_ms": args.deadline_ms})
    served: Counter[str] = Counter()
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        for i in range(3):  # warm-up: the latency model, the slot hold time
            for engine in ("cloud", "local"):
                await client.complete(
                    PROMPTS[i], engine=engine, max_tokens=args.max_tokens, temperature=0.0
                )

        async def one(i: int) -> None:
            try:
                done = await client.complete(
                    PROMPTS[i % len(PROMPTS)], policy=policy, max_tokens=args.max_tokens,
                    temperature=0.0,
                )  # fmt: skip
            except Exception:  # counted, not fatal
                row.errors += 1
                return
            t = done.trace
            ttft = t.ttft_ms
            if ttft is None:
                row.errors += 1
                return
            row.ttft_ms.append(ttft)
            served[t.engine or "none"] += 1
            row.misses += ttft > args.deadline_ms
            row.queue_routed += "cloud_queue" in t.reason_codes

        async with anyio.create_task_group() as tg:
            for i in range(args.n):
                tg.start_soon(one, i)
    row.engines = dict(served)
    return row


async def main(args: argparse.Namespace) -> dict[str, object]:
    path = Path(resolve_model(MODEL))
    rows = []
    with LlamaServer(
        path, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1,
        extra_args=["--interrupt_requests", "false"],
    ) as server:  # fmt: skip
        for limit in (None, args.limit):
            rows.append(await run(path, server.base_url, limit, args))
    print(f"{args.n} concurrent requests, deadline {args.deadline_ms:.0f} ms, "
          f"{args.max_tokens} tokens; cloud and local: SmolLM2-135M (one thread each)")  # fmt: skip
    print(f"{'':<9} {'P50':>6} {'P90':>6} {'P99':>6} {'misses':>6} {'errors':>6} "
          f"{'queue->local':>12}  served")  # fmt: skip
    for r in rows:
        print(f"{r.name:<9} {r.pct(50):>6.0f} {r.pct(90):>6.0f} {r.pct(99):>6.0f} "
              f"{r.misses:>6} {r.errors:>6} {r.queue_routed:>12}  {r.engines}")  # fmt: skip
    return {"rows": [asdict(r) for r in rows], "args": vars(args)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="16 requests")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--deadline-ms", type=float, default=1000.0)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if args.quick:
        args.n = 16
    out = anyio.run(main, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
