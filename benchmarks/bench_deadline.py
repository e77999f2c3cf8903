"""Deadline benchmark: first-token latency against a cloud with a heavy-tailed first byte.

    python benchmarks/bench_deadline.py [--n 200] [--quick] [--deadline-ms 500]
                                        [--local-model NAME] [--seed 1] [--json PATH]
                                        [--hedge-ms 0,100]

The "cloud" is the real `llama_cpp.server` (SmolLM2-135M, one thread) on loopback behind a
`FaultProxy`; before each request the proxy gets that request's extra first-byte delay, drawn
once per run from a heavy tail (lognormal, median 150 ms, p99 3 s, plus 3% stalls of 5 s), so
every strategy sees the same delay for request i (a paired comparison). The local engine is
`LlamaCppEngine` (Qwen2.5-Coder-0.5B by default, one thread: the server has the other core).
Short prompts, max_tokens 8, greedy. TTFT is measured in the app: from the call to the first
token the app receives.

Strategies (same prompts, same delays, each on a fresh client after 5 undelayed warm-ups):

- cloud only;
- timeout-then-fallback (what most gateways do): the cloud with a first-token timeout equal to
  the deadline (or until it fails), then the local engine, sequentially;
- hybridllm's deadline race: `Policy(prefer="cloud", ttft_deadline_ms=D)`;
- hybridllm with hedging: the same plus `hedge_after_ms="auto"`;
- hybridllm with a fixed hedge, one row per `--hedge-ms` value (default 0 and 100): the local
  engine starts that long after the call whatever the prediction (0: both engines at once), so
  the first token comes from whichever is faster at the price of local work on most requests
  ("hedged" counts the requests where the local engine was started as a hedge).

"extra cloud" counts requests where a cloud request was started but did not serve the answer
(wasted cloud work). A second run stalls every cloud first byte by 5 s and reports, request by
request, who answered and how long it took against the local engine's own TTFT measured in the
same run. No timed assertions.

Other processes on the two cores slow llama.cpp many times over: run this on quiet cores.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

import anyio

from benchmarks._report import report
from hybridllm import HybridClient, Policy
from hybridllm.engines import LlamaCppEngine, OpenAIEngine
from hybridllm.errors import EngineError, HybridError
from hybridllm.local.resolve import resolve_model
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.testing import FaultProxy, Faults, LlamaServer
from hybridllm.testing.proxy import heavy_tail

API_KEY = "sk-bench"
ALIAS = "cloud"
MAX_TOKENS = 8
WARMUPS = 5
STALL_MS = 5000.0
PROMPTS = [
    "Say hi.",
    "What is 2 + 2?",
    "Name a colour.",
    "Give me a word that rhymes with cat.",
    "What is the capital of France?",
    "Translate 'thank you' into Spanish.",
    "Name one planet.",
    "Reply with a single emoji.",
    "Is water wet? Answer briefly.",
    "Name a fruit.",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """One request as the app saw it."""

    ttft_ms: float | None
    served_by: str | None
    cloud_started: bool
    delay_ms: float = 0.0  # the proxy's extra first-byte delay for this request
    fallback_ms: float | None = None  # when the backup started (hybridllm) or the timeout fired
    routed: str = ""  # hybridllm's route reason
    hedged: bool = False
    error: str | None = None

    @property
    def extra_cloud(self) -> bool:
        return self.cloud_started and self.served_by != "cloud"


@dataclass
class Series:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)

    def ttfts(self) -> list[float]:
        return [o.ttft_ms for o in self.outcomes if o.ttft_ms is not None]

    def row(self) -> dict[str, object]:
        xs = sorted(self.ttfts())
        n = len(self.outcomes)
        return {
            "strategy": self.name,
            "n": n,
            "p50": _pct(xs, 50),
            "p95": _pct(xs, 95),
            "p99": _pct(xs, 99),
            "max": xs[-1] if xs else math.nan,
            "extra_cloud": sum(o.extra_cloud for o in self.outcomes),
            "served_local": sum(o.served_by == "local" for o in self.outcomes),
            "circuit_local": sum("circuit" in o.routed for o in self.outcomes),
            "hedged": sum(o.hedged for o in self.outcomes),
            "errors": sum(o.error is not None for o in self.outcomes),
        }


def _pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted xs."""
    if not xs:
        return math.nan
    k = max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))
    return xs[k]


def cpu_sample(pids: Sequence[int]) -> tuple[float, float, float]:
    """(wall, whole-system busy CPU s, CPU s of this process and `pids`), from Linux /proc."""
    try:
        tck = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as fh:
            vals = [int(v) for v in fh.readline().split()[1:9]]
        busy = (sum(vals) - vals[3] - vals[4]) / tck
        t = os.times()
        ours = t.user + t.system
        for pid in pids:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            ours += (int(f[11]) + int(f[12])) / tck
    except (OSError, ValueError, IndexError):
        return time.perf_counter(), math.nan, math.nan
    return time.perf_counter(), busy, ours


def foreign_cores(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Average cores other processes used between two samples."""
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / max(b[0] - a[0], 1e-3)


# ---- one request, per strategy ----------------------------------------------------------------


async def via_hybridllm(client: HybridClient, prompt: str, **kw: object) -> Outcome:
    """Any request through `client.stream` (policy routing, or a forced engine)."""
    t0 = time.perf_counter()
    first: float | None = None
    try:
        async with client.stream(prompt, **kw) as s:  # type: ignore[arg-type]
            async for _ in s:
                if first is None:
                    first = time.perf_counter()
    except HybridError as exc:
        return Outcome(None, None, True, error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # not hybridllm's typed error: a bug, counted in "errors"
        log(f"  untyped error from hybridllm: {type(exc).__name__}: {exc!r}")
        ttft = None if first is None else (first - t0) * 1e3
        return Outcome(ttft, None, True, error=f"untyped: {exc!r}")
    tr = s.trace
    fb = tr.segments_ms.get("fallback_started")
    return Outcome(
        None if first is None else (first - t0) * 1e3,
        tr.engine,
        "cloud" in tr.started,
        fallback_ms=fb,
        routed=tr.route_reason,
        hedged=tr.hedged,
    )


async def timeout_then_fallback(client: HybridClient, prompt: str, deadline_s: float) -> Outcome:
    """The gateway baseline: cloud with a first-token timeout, then the local engine."""
    t0 = time.perf_counter()
    first: float | None = None
    s = client.stream(prompt, engine="cloud")
    try:
        with anyio.move_on_after(deadline_s):
            await s.__anext__()
            first = time.perf_counter()
    except (EngineError, StopAsyncIteration):
        pass  # failed before the deadline: fall back now
    if first is not None:
        async with s:
            async for _ in s:
                pass
        return Outcome((first - t0) * 1e3, "cloud", True)
    await s.aclose()
    gave_up = (time.perf_counter() - t0) * 1e3
    try:
        async with client.stream(prompt, engine="local") as s2:
            async for _ in s2:
                if first is None:
                    first = time.perf_counter()
    except HybridError as exc:
        return Outcome(None, None, True, fallback_ms=gave_up, error=f"{type(exc).__name__}")
    ttft = None if first is None else (first - t0) * 1e3
    return Outcome(ttft, "local", True, fallback_ms=gave_up)


# ---- runs ---------------------------------------------------------------------------------------

Request = Callable[[HybridClient, str], Awaitable[Outcome]]


async def run_series(
    name: str,
    client: HybridClient,
    proxy: FaultProxy,
    delays: Sequence[float],
    request: Request,
) -> Series:
    series = Series(name)
    await warm_up(client, proxy, request)
    t0 = time.perf_counter()
    for i, delay in enumerate(delays):
        proxy.faults = Faults(first_byte_stall_ms=delay)
        out = await request(client, PROMPTS[i % len(PROMPTS)])
        out.delay_ms = delay
        series.outcomes.append(out)
    proxy.faults = Faults()
    log(f"  {name}: {len(delays)} requests in {time.perf_counter() - t0:.1f} s")
    return series


async def warm_up(client: HybridClient, proxy: FaultProxy, request: Request) -> None:
    """Warm caches and give hedging its TTFT history (not counted); the circuit starts closed."""
    proxy.faults = Faults()
    for i in range(WARMUPS):
        await request(client, PROMPTS[i % len(PROMPTS)])
    client.breakers["cloud"] = CircuitBreaker()


def cloud_engine(proxy: FaultProxy) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)


async def main(args: argparse.Namespace) -> dict[str, object]:
    n = args.n or (60 if args.quick else 200)
    d_s = args.deadline_ms / 1000.0
    rng = random.Random(args.seed)
    dist = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=STALL_MS)
    delays = [dist(rng) for _ in range(n)]
    local_path = resolve_model(args.local_model, pull=True)
    cloud_path = resolve_model("smollm2-135m-instruct", pull=True)

    def make_local() -> LlamaCppEngine:
        return LlamaCppEngine(local_path, n_ctx=2048, n_threads=1)

    base = Policy(
        name="bench",
        # the first token wins, as the race measured here always did (a latency decision; with
        # objective "quality" the local engine would be a held rescue: bench_quality_race.py)
        routing={"prefer": "cloud", "objective": "latency", "retries": 0},
        sampling={"max_tokens": MAX_TOKENS, "temperature": 0},
    )
    race = base.with_(name="race", routing={"ttft_deadline_ms": args.deadline_ms})
    hedge = race.with_(name="hedge", hedge={"after_ms": "auto"})
    results: list[Series] = []
    with (
        LlamaServer(cloud_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024, n_threads=1) as server,
        FaultProxy(upstream=("127.0.0.1", server.port)) as proxy,
    ):
        pids = [server.pid] if server.pid is not None else []
        cpu0 = cpu_sample(pids)
        log(f"heavy-tail run: {n} requests, deadline {args.deadline_ms:.0f} ms")
        async with HybridClient(cloud=cloud_engine(proxy), policy=base) as client:
            results.append(await run_series("cloud only", client, proxy, delays, via_hybridllm))
            log(f"  client breakers after: {client.breakers['cloud'].state}")

        async def seq(c: HybridClient, p: str) -> Outcome:
            return await timeout_then_fallback(c, p, d_s)

        local_ref = Series("local only (reference)")
        async with HybridClient(
            local=make_local(), cloud=cloud_engine(proxy), policy=base
        ) as client:
            results.append(
                await run_series(
                    f"timeout {args.deadline_ms:.0f} ms -> local", client, proxy, delays, seq
                )
            )
            for i in range(min(n, 40)):  # the local engine alone, same prompts
                local_ref.outcomes.append(
                    await via_hybridllm(client, PROMPTS[i % len(PROMPTS)], engine="local")
                )
        for label, pol in (
            (f"hybridllm race D={args.deadline_ms:.0f}", race),
            ("hybridllm race + hedge auto", hedge),
            *(
                (
                    f"hybridllm race + hedge {ms:g} ms",
                    race.with_(name=f"hedge{ms:g}", hedge={"after_ms": ms}),
                )
                for ms in args.hedge_ms
            ),
        ):
            async with HybridClient(
                local=make_local(), cloud=cloud_engine(proxy), policy=pol
            ) as client:
                results.append(await run_series(label, client, proxy, delays, via_hybridllm))
                opened = client.breakers["cloud"].state
                log(f"  cloud circuit at the end: {opened}")
        results.append(local_ref)

        # ---- persistent stall: every cloud first byte 5 s late -------------------------------
        k = 6 if args.quick else 10
        log(f"persistent-stall run: {k} requests, every cloud first byte +{STALL_MS:.0f} ms")
        stalled: list[Outcome] = []
        own: list[Outcome] = []
        async with HybridClient(
            local=make_local(), cloud=cloud_engine(proxy), policy=race
        ) as client:
            await warm_up(client, proxy, via_hybridllm)
            proxy.faults = Faults(first_byte_stall_ms=STALL_MS)
            states = []
            for i in range(k):
                stalled.append(await via_hybridllm(client, PROMPTS[i % len(PROMPTS)]))
                states.append(client.breakers["cloud"].state)
            proxy.faults = Faults()
            for i in range(k):  # the local engine's own TTFT, same prompts, same order
                own.append(await via_hybridllm(client, PROMPTS[i % len(PROMPTS)], engine="local"))
        foreign = foreign_cores(cpu0, cpu_sample(pids))
    table = [s.row() for s in results]
    persistent = [
        {
            "i": i + 1,
            "served_by": o.served_by,
            "ttft_ms": o.ttft_ms,
            "local_own_ttft_ms": r.ttft_ms,
            "fallback_started_ms": o.fallback_ms,
            "cloud_started": o.cloud_started,
            "circuit_after": st,
            "route": o.routed,
            "error": o.error,
        }
        for i, (o, r, st) in enumerate(zip(stalled, own, states, strict=True))
    ]
    delay_stats = {
        "p50": _pct(sorted(delays), 50),
        "p95": _pct(sorted(delays), 95),
        "p99": _pct(sorted(delays), 99),
        "stalls_5s": sum(d == STALL_MS for d in delays),
    }
    return {
        "n": n,
        "deadline_ms": args.deadline_ms,
        "local_model": args.local_model,
        "delays": delay_stats,
        "foreign_cores": foreign,
        "table": table,
        "persistent": persistent,
        "series": {s.name: [asdict(o) for o in s.outcomes] for s in results},
    }


def render(res: dict[str, object]) -> str:
    out: list[str] = []
    d = res["delays"]
    assert isinstance(d, dict)
    out.append(
        f"{res['n']} requests, deadline {res['deadline_ms']:.0f} ms, local {res['local_model']}; "
        f"extra cloud first-byte delay p50 {d['p50']:.0f} / p95 {d['p95']:.0f} / "
        f"p99 {d['p99']:.0f} ms, {d['stalls_5s']} stalls of 5 s; other processes used "
        f"{res['foreign_cores']:.2f} cores on average"
    )
    cols = [
        "strategy",
        "n",
        "p50",
        "p95",
        "p99",
        "max",
        "extra_cloud",
        "served_local",
        "circuit_local",
        "hedged",
        "errors",
    ]
    rows = [cols]
    table = res["table"]
    assert isinstance(table, list)
    for r in table:
        rows.append([r[c] if isinstance(r[c], str) else f"{r[c]:.0f}" for c in cols])
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols))]
    out.append("TTFT in ms, measured in the app")
    for j, row in enumerate(rows):
        out.append(
            "  ".join(
                str(v).ljust(w) if i == 0 else str(v).rjust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("")
    out.append("persistent stall (every cloud first byte +5 s), deadline race, both engines:")
    out.append(
        f"{'#':>2}  {'served':6}  {'TTFT':>6}  {'local own':>9}  {'backup at':>9}  "
        f"{'circuit':8}  route"
    )
    persistent = res["persistent"]
    assert isinstance(persistent, list)
    for p in persistent:

        def ms(x: object) -> str:
            return "-" if x is None else f"{x:.0f}"

        out.append(
            f"{p['i']:>2}  {p['served_by'] or 'error':6}  {ms(p['ttft_ms']):>6}  "
            f"{ms(p['local_own_ttft_ms']):>9}  {ms(p['fallback_started_ms']):>9}  "
            f"{p['circuit_after']:8}  {p['route']}"
        )
    return "\n".join(out)


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="requests per strategy (default 200)")
    ap.add_argument("--quick", action="store_true", help="60 requests per strategy")
    ap.add_argument("--deadline-ms", type=float, default=500.0)
    ap.add_argument("--local-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    ap.add_argument("--hedge-ms", default="0,100", metavar="MS,...",
                    help="fixed hedge delays to add as rows ('' for none)")  # fmt: skip
    args = ap.parse_args()
    args.hedge_ms = [float(x) for x in args.hedge_ms.split(",") if x.strip()]
    res = anyio.run(main, args)
    report(res, render, args.json)


if __name__ == "__main__":
    cli()
