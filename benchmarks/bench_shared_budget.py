"""Shared budget benchmark: two gateway processes, one ledger, a $0.80 cap.

    python benchmarks/bench_shared_budget.py [--streams 100] [--cycles 500] [--json PATH]

Starts its own `redis-server` on a free loopback port (`hybridllm.testing.RedisServer`). Two
parts, each run on the Redis ledger and, in the same run, on the SQLite ledger (one WAL file
shared by the two processes):

1. Streams. Two processes, each a `HybridClient` whose ledger is the shared one (`ledger=` its
   URL), start `--streams` / 2 streams each, 10 ms apart, cloud first, under one global daily cap
   of $0.80. The engines are `ScriptedEngine` doubles (the ledger is the subject): the cloud
   answers 48 tokens and reports a known usage (the prompt bound and 48 completion tokens, $0.0247
   at the prices below; its reservation holds the worst case, 64 tokens: $0.0295). Printed: the
   total settled, the largest overrun (settled above the cap; target 0) and the largest
   per-request overrun (billed above a reservation; 0 here), how many answers the cloud gave and
   how many the budget sent to the local engine.
2. Latency. The two processes reserve and settle `--cycles` times each at once, one global cap
   and one per-scope cap; p50 and p99 milliseconds of `reserve` and `settle`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402

from hybridllm import Cap, HybridClient, ModelPrice, Policy, Prices  # noqa: E402
from hybridllm.engines.base import GenerationRequest  # noqa: E402
from hybridllm.events import Chunk, Finish  # noqa: E402
from hybridllm.guard.budget import TokenUsage  # noqa: E402
from hybridllm.guard.guarded import request_token_bound  # noqa: E402
from hybridllm.guard.ledgers import ledger_from_url  # noqa: E402
from hybridllm.testing import RedisServer, ScriptedEngine  # noqa: E402

CAP_USD = 0.80
PRICE = ModelPrice(
    input_per_million=100.0, output_per_million=300.0
)  # dear: about 31 answers fit $0.80
PRICES = Prices(models={"scripted": PRICE})
CLOUD_FIRST = Policy(name="chat", routing={"prefer": "cloud"})
PROMPT = "Summarise the news in one line."
MAX_TOKENS, ANSWER_TOKENS = 64, 48
REQUEST = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS)
USAGE = TokenUsage(request_token_bound(REQUEST), ANSWER_TOKENS)  # what the cloud reports
STAGGER_S = 0.01


class FixedUsageCloud(ScriptedEngine):
    """A scripted cloud whose every answer reports `USAGE`, as a provider's last chunk does."""

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        async for chunk in super().stream(request):
            if isinstance(chunk, Finish):
                chunk = Finish(chunk.reason, USAGE.prompt_tokens, USAGE.completion_tokens, chunk.t)
            yield chunk


async def _streams(url: str, n: int, offset: int) -> dict[str, int]:
    """One gateway: `n` streams, started `STAGGER_S` apart (interleaved with the other's)."""
    client = HybridClient(
        local=ScriptedEngine("local", tokens=["l"] * 8, ttft_s=0.01, tpot_s=0.002),
        cloud=FixedUsageCloud("cloud", tokens=["c"] * ANSWER_TOKENS, ttft_s=0.05, tpot_s=0.005),
        policy=CLOUD_FIRST,
        router=None,
        ledger=url,
        prices=PRICES,
        budget_caps=[Cap(None, "day", CAP_USD)],
    )
    counts = {"cloud": 0, "local": 0, "unanswered": 0}

    async def one(i: int) -> None:
        await anyio.sleep((2 * i + offset) * STAGGER_S)
        async with client.stream(PROMPT, max_tokens=MAX_TOKENS) as s:
            text = "".join([t async for t in s])
        counts[s.trace.engine if text and s.trace.engine else "unanswered"] += 1

    async with client, anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return counts


def _stream_worker(url: str, n: int, offset: int, q: multiprocessing.Queue[Any]) -> None:
    q.put(anyio.run(_streams, url, n, offset))


def _cycle_worker(url: str, n: int, q: multiprocessing.Queue[Any]) -> None:
    """Reserve and settle `n` times; the milliseconds of each."""
    ledger = ledger_from_url(url)
    caps = [Cap(None, "day", 1e9), Cap("chat", "day", 1e9)]
    out: dict[str, list[float]] = {"reserve": [], "settle": []}
    for _ in range(n):
        t = time.perf_counter()
        r = ledger.reserve(
            model="m", price=PRICE, prompt_tokens=800, max_tokens=256, scope="chat", caps=caps
        )
        out["reserve"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        ledger.settle(r, TokenUsage(750, 120))
        out["settle"].append((time.perf_counter() - t) * 1e3)
    ledger.close()
    q.put(out)


def _two(target: Any, args_of: Callable[[int], tuple[Any, ...]]) -> list[Any]:
    """`target(*args_of(i), queue)` in two spawned processes (i = 0, 1) at once; what each put
    on the queue."""
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), q)) for i in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def streams_part(url: str, n: int) -> dict[str, float]:
    per = n // 2
    counts = _two(_stream_worker, lambda i: (url, per + (n % 2) * (i == 0), i))
    ledger = ledger_from_url(url)
    spend, entries = ledger.spend("day"), ledger.entries()
    ledger.close()
    per_request = max((int(e["overrun_nano"]) for e in entries), default=0) / 1e9
    return {
        "settled_usd": spend.settled_usd,
        "held_usd": spend.reserved_usd,
        "overrun_usd": max(0.0, spend.settled_usd - CAP_USD),
        "per_request_overrun_usd": per_request,
        "cloud": sum(c["cloud"] for c in counts),
        "local": sum(c["local"] for c in counts),
        "unanswered": sum(c["unanswered"] for c in counts),
    }


def latency_part(url: str, n: int) -> dict[str, list[float]]:
    runs = _two(_cycle_worker, lambda i: (url, n))
    return {k: [x for r in runs for x in r[k]] for k in ("reserve", "settle")}


def pq(ms: list[float]) -> str:
    p = statistics.quantiles(ms, n=100, method="inclusive")
    return f"p50 {p[49]:6.3f}  p99 {p[98]:6.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    worst = PRICE.cost_usd(USAGE.prompt_tokens, MAX_TOKENS)
    answer = PRICE.cost_usd(USAGE.prompt_tokens, USAGE.completion_tokens)
    print(f"cap ${CAP_USD:.2f}; a cloud request holds ${worst:.4f} and settles at ${answer:.4f}")
    out: dict[str, Any] = {}
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        ledgers = {
            "redis": lambda: f"{server.url}?prefix=bench-{uuid.uuid4().hex}",
            "sqlite": lambda: str(Path(tmp) / f"{uuid.uuid4().hex}.db"),
        }
        for name, fresh in ledgers.items():
            url = fresh()
            ledger_from_url(url).close()  # created once (the SQLite file's schema)
            t = time.perf_counter()
            s = streams_part(url, args.streams)
            wall = time.perf_counter() - t
            print(
                f"{name:6s} {args.streams} streams, 2 processes: settled ${s['settled_usd']:.4f} "
                f"(held ${s['held_usd']:.4f}), largest overrun ${s['overrun_usd']:.4f}, "
                f"per-request overrun ${s['per_request_overrun_usd']:.4f}; cloud {s['cloud']}, "
                f"local {s['local']}, unanswered {s['unanswered']} ({wall:.1f} s)"
            )
            out[name] = {"streams": s}
        for name, fresh in ledgers.items():
            url = fresh()
            ledger_from_url(url).close()
            lat = latency_part(url, args.cycles)
            out[name]["latency_ms"] = lat
            print(
                f"{name:6s} reserve {pq(lat['reserve'])}   settle {pq(lat['settle'])}  "
                f"(ms; 2 processes x {args.cycles})"
            )
    r, q = out["redis"]["latency_ms"]["reserve"], out["sqlite"]["latency_ms"]["reserve"]
    print(f"reserve p50 redis/sqlite: {statistics.median(r) / statistics.median(q):.2f}x")
    if args.json:
        args.json.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
