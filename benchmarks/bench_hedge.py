"""Automatic hedge benchmark: TTFT against a heavy-tailed cloud, the hedge's delay chosen by
price (`routing.hedging`) against fixed delays, no hedge and timeout-then-fallback.

    PYTHONPATH=$PWD python benchmarks/bench_hedge.py [--n 30] [--deadline-ms 600] [--seed 1]
                                                     [--quick] [--json PATH]

The cloud is the real `llama_cpp.server` (SmolLM2-135M, one thread) on loopback behind a
`FaultProxy` that delays each request's first byte by a draw from a heavy tail (lognormal, median
150 ms, p99 3 s, plus 3% stalls of 10 s); request i gets the same delay in every strategy (a
paired comparison). The local engine is SmolLM2-135M too (one thread: the server has the other
core; on this 2-core machine both engines share the cores with each other). Policy: cloud first,
deadline 600 ms, max_tokens 8, greedy. Each strategy runs on a fresh client after 10 warm-up
requests drawn from the same tail (not counted), so "auto" has a history to price.

Rows: the deadline race without a hedge; fixed hedges of 0, 50, 100 and 200 ms; `auto` (the
delay minimising the expected p99 TTFT plus the hedge's price: a local hedge costs device time,
`hedge_device_weight` = 1 ms of p99 per ms of local work, and 5 in a second row); LiteLLM-style
timeout-then-fallback (the cloud with a first-token timeout equal to the deadline, then the
local engine). Columns: TTFT P50/P95/P99 in
the app (nearest rank), "local started" (requests that ran the local engine), "cloud lost"
(cloud requests sent that did not serve the answer) and "extra cloud" (cloud requests beyond the
one every request sends: what a local hedge must keep at 0).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict

import anyio

from benchmarks._report import report
from benchmarks.bench_deadline import (
    PROMPTS,
    Outcome,
    Series,
    cloud_engine,
    timeout_then_fallback,
    via_hybridllm,
)
from hybridllm import HybridClient, LlamaCppEngine, Policy
from hybridllm.local.resolve import resolve_model
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.testing import FaultProxy, Faults, LlamaServer
from hybridllm.testing.proxy import heavy_tail

API_KEY, ALIAS = "sk-bench", "cloud"
MAX_TOKENS = 8
WARMUPS = 10
STALL_MS = 10_000.0
Request = Callable[[HybridClient, str], Awaitable[Outcome]]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def run_series(
    name: str,
    client: HybridClient,
    proxy: FaultProxy,
    warm: Sequence[float],
    delays: Sequence[float],
    request: Request,
) -> Series:
    for i, delay in enumerate(warm):
        proxy.faults = Faults(first_byte_stall_ms=delay)
        await request(client, PROMPTS[i % len(PROMPTS)])
    client.breakers["cloud"] = CircuitBreaker()  # every strategy starts with a closed circuit
    series = Series(name)
    proxy.record = True
    before = _cloud_requests(proxy)
    t0 = time.perf_counter()
    for i, delay in enumerate(delays):
        proxy.faults = Faults(first_byte_stall_ms=delay)
        out = await request(client, PROMPTS[i % len(PROMPTS)])
        out.delay_ms = delay
        series.outcomes.append(out)
    proxy.faults = Faults()
    series.cloud_requests = _cloud_requests(proxy) - before  # type: ignore[attr-defined]
    log(f"  {name}: {len(delays)} requests in {time.perf_counter() - t0:.1f} s")
    return series


def _cloud_requests(proxy: FaultProxy) -> int:
    return sum(b"/chat/completions" in head for head, _ in proxy.requests())


def strategy(pol: Policy | None, deadline_s: float) -> Request:
    """One request of a strategy (None: timeout-then-fallback)."""

    async def one(c: HybridClient, p: str) -> Outcome:
        if pol is None:
            return await timeout_then_fallback(c, p, deadline_s)
        return await via_hybridllm(c, p)

    return one


def row(s: Series) -> dict[str, object]:
    r = s.row()
    out = {k: r[k] for k in ("strategy", "n", "p50", "p95", "p99", "errors")}
    # the local engine ran: it served, or it was started (hedge, deadline, fallback)
    out["local_started"] = sum(
        o.served_by == "local" or o.fallback_ms is not None for o in s.outcomes
    )
    out["cloud_lost"] = r["extra_cloud"]
    # cloud requests that reached the network beyond one per request
    out["extra_cloud"] = getattr(s, "cloud_requests", 0) - len(s.outcomes)
    hedges = sorted(o.fallback_ms for o in s.outcomes if o.hedged and o.fallback_ms is not None)
    out["hedge_ms_median"] = hedges[len(hedges) // 2] if hedges else None
    return out


async def main(args: argparse.Namespace) -> dict[str, object]:
    n = args.n or (15 if args.quick else 30)
    rng = random.Random(args.seed)
    dist = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=STALL_MS)
    warm = [dist(rng) for _ in range(WARMUPS)]
    delays = [dist(rng) for _ in range(n)]
    path = resolve_model("smollm2-135m-instruct", pull=True)
    base = Policy(
        name="bench",
        # the same model on both sides: the first token wins (a latency decision; with
        # objective "quality" the local engine would be a held rescue: bench_quality_race.py)
        routing={
            "prefer": "cloud",
            "objective": "latency",
            "retries": 0,
            "ttft_deadline_ms": args.deadline_ms,
        },
        sampling={"max_tokens": MAX_TOKENS, "temperature": 0},
    )
    rows: list[dict[str, object]] = []
    detail: dict[str, list[dict[str, object]]] = {}
    strategies: list[tuple[str, Policy | None]] = [
        (f"deadline race {args.deadline_ms:.0f} ms, no hedge", base),
        *(
            (f"fixed hedge {ms:g} ms", base.with_(hedge={"after_ms": float(ms)}))
            for ms in (0, 50, 100, 200)
        ),
        ("auto hedge (priced)", base.with_(hedge={"after_ms": "auto"})),
        (
            "auto hedge, device time 5x dearer",
            base.with_(hedge={"after_ms": "auto", "device_weight": 5.0}),
        ),
        (f"timeout {args.deadline_ms:.0f} ms -> local (LiteLLM-style)", None),
    ]
    with (
        LlamaServer(path, alias=ALIAS, api_key=API_KEY, n_ctx=1024, n_threads=1) as server,
        FaultProxy(upstream=("127.0.0.1", server.port)) as proxy,
    ):
        for label, pol in strategies:
            if args.only and args.only not in label:
                continue
            local = LlamaCppEngine(path, n_ctx=1024, n_threads=1)
            async with HybridClient(
                local=local, cloud=cloud_engine(proxy), policy=pol or base, router=None
            ) as client:
                one = strategy(pol, args.deadline_ms / 1000)
                series = await run_series(label, client, proxy, warm, delays, one)
                rows.append(row(series))
                detail[label] = [asdict(o) for o in series.outcomes]
    return {
        "n": n, "deadline_ms": args.deadline_ms, "delays": sorted(delays), "table": rows,
        "series": detail,
    }  # fmt: skip


def render(res: dict[str, object]) -> str:
    cols = ["strategy", "n", "p50", "p95", "p99", "local_started", "cloud_lost", "extra_cloud",
            "hedge_ms_median", "errors"]  # fmt: skip
    table = res["table"]
    assert isinstance(table, list)
    cells = [cols] + [
        [r[c] if isinstance(r[c], str) else "-" if r[c] is None else f"{r[c]:.0f}" for c in cols]
        for r in table
    ]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(cols))]
    lines = [f"{res['n']} requests, deadline {res['deadline_ms']:.0f} ms; TTFT in ms in the app"]
    for j, cells_row in enumerate(cells):
        pairs = enumerate(zip(cells_row, widths, strict=True))
        lines.append(
            "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in pairs)
        )
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cli() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="requests per strategy (default 30)")
    ap.add_argument("--quick", action="store_true", help="15 requests per strategy")
    ap.add_argument("--deadline-ms", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="", help="run only the strategies whose name has this")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    args = ap.parse_args()
    res = anyio.run(main, args)
    report(res, render, args.json)


if __name__ == "__main__":
    cli()
