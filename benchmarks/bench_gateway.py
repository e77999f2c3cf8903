"""The gateway's cost and behaviour (issue 29): overhead, disconnect to engine stop, saturation.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_gateway.py [--runs 8] [--max-tokens 48]
        [--threads 1] [--clients 50] [--limit 8] [--json out.json]

One process, one event loop: a `HybridClient` (Qwen2.5-Coder 0.5B in process; the stand-in
cloud, SmolLM2 behind `hybridllm serve-model`, reached through a `FaultProxy`) and the gateway
over that same client, served by uvicorn on loopback in the same loop. Printed:

- overhead: TTFT (P50 over runs) and decode tokens/s of the same greedy local request through
  the gateway (raw SSE over httpx, timed at the HTTP client: request sent to first content
  chunk) and through `HybridClient.stream()` in process (call to first token), interleaved
  run by run (the order alternates), with their difference and ratio;
- disconnect to engine stop, from the client's socket close (the HTTP client leaves after the
  first content chunk): local, to the llama thread's last step (`LlamaCppEngine.stopped_at`,
  beside one decode step, the engine's TPOT); cloud, to the moment the proxy sees the gateway
  close its upstream connection;
- saturation: `--clients` streaming clients at once against a concurrency limit of `--limit`:
  answered (a whole stream to [DONE]), told 429 (with Retry-After), and lost (anything else).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import cpu_model, report  # noqa: E402

LOCAL, STANDIN = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
KEY, CLOUD_KEY = "sk-bench-gw", "sk-bench-cloud"
POLICIES = {
    "bench-local": '[sampling]\ntemperature = 0.0\n[routing]\nprefer = "local"\n'
    'allow_cloud = false\nfallback_order = ["local"]\n',
    "bench-cloud": '[sampling]\ntemperature = 0.0\n[routing]\nprefer = "cloud"\n'
    'fallback_order = ["cloud"]\n',
}
ASK = [{"role": "user", "content": "Write a Python function that checks if a number is prime."}]
COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]


async def until(check: Callable[[], bool]) -> None:
    """Poll `check` every millisecond (a flag set on another thread or by uvicorn)."""
    while not check():  # noqa: ASYNC110 - observing state from outside (no event to wait on)
        await asyncio.sleep(0.001)


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Bench:
    """The client, the gateway over it, and an HTTP client, in one loop."""

    def __init__(self, client: Any, url: str, proxy: Any, http: Any) -> None:
        self.client, self.url, self.proxy, self.http = client, url, proxy, http
        self.headers = {"authorization": f"Bearer {KEY}"}

    async def through_gateway(self, max_tokens: int) -> tuple[float, float]:
        """TTFT (ms) and decode tokens/s of one streamed request, at the HTTP client."""
        body = {"model": "bench-local", "messages": ASK, "stream": True, "max_tokens": max_tokens}
        t0, times = time.perf_counter(), []
        async with self.http.stream(
            "POST", f"{self.url}/chat/completions", json=body, headers=self.headers
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"content": "' in line:
                    if json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        times.append(time.perf_counter())
        return _figures(t0, times)

    async def in_process(self, max_tokens: int) -> tuple[float, float]:
        from hybridllm.events import Token

        t0, times = time.perf_counter(), []
        async with self.client.stream(ASK, policy="bench-local", max_tokens=max_tokens) as s:
            async for event in s.events():
                if isinstance(event, Token) and event.text:
                    times.append(time.perf_counter())
        return _figures(t0, times)

    async def leave_after_first(self, policy: str, at_first: Callable[[], None]) -> float:
        """Stream a long answer, leave after the first content chunk; when the socket closed."""
        body = {"model": policy, "messages": COUNT, "stream": True, "max_tokens": 300}
        async with self.http.stream(
            "POST", f"{self.url}/chat/completions", json=body, headers=self.headers
        ) as r:
            async for line in r.aiter_lines():
                if '"content": "' in line and '"content": ""' not in line:
                    at_first()
                    break
            await r.aclose()  # closes the connection: the answer was not read to its end
            return time.monotonic()


def _figures(t0: float, times: list[float]) -> tuple[float, float]:
    ttft = (times[0] - t0) * 1e3
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return ttft, rate


async def overhead(b: Bench, runs: int, max_tokens: int) -> dict[str, Any]:
    gw: list[tuple[float, float]] = []
    direct: list[tuple[float, float]] = []
    await b.in_process(max_tokens)  # the prompt's cache and the first-request costs, once
    await b.through_gateway(max_tokens)
    for i in range(runs):
        order = (
            (b.through_gateway, b.in_process) if i % 2 == 0 else (b.in_process, b.through_gateway)
        )
        for run in order:
            (gw if run == b.through_gateway else direct).append(await run(max_tokens))
    g_ttft, d_ttft = p50([t for t, _ in gw]), p50([t for t, _ in direct])
    g_tps, d_tps = p50([r for _, r in gw]), p50([r for _, r in direct])
    return {
        "runs": runs,
        "gateway": {"ttft_ms_p50": g_ttft, "tokens_per_s_p50": g_tps},
        "in_process": {"ttft_ms_p50": d_ttft, "tokens_per_s_p50": d_tps},
        "ttft_overhead_ms": g_ttft - d_ttft,
        "throughput_ratio": g_tps / d_tps,
    }


async def disconnects(b: Bench, local: Any, repeats: int) -> dict[str, Any]:
    local_ms: list[float] = []
    for _ in range(repeats):
        closed = await b.leave_after_first("bench-local", lambda: None)
        await until(lambda: not local.busy)  # the engine stamps its stop itself
        local_ms.append((local.stopped_at - closed) * 1e3)  # the loop's clock is monotonic
    cloud_ms: list[float] = []
    for _ in range(repeats):
        before = {c.id: c.bytes_down for c in b.proxy.connections}
        streaming: list[int] = []

        def find(before: dict[int, int] = before, streaming: list[int] = streaming) -> None:
            streaming.extend(
                c.id
                for c in b.proxy.connections
                if c.closed_at is None and c.bytes_down > before.get(c.id, 0)
            )

        closed = await b.leave_after_first("bench-cloud", find)
        seen = await asyncio.to_thread(b.proxy.wait_client_closed, streaming[0], 30.0)
        cloud_ms.append((seen - closed) * 1e3)
    return {
        "local_ms": local_ms,
        "local_decode_step_ms": (local.tpot_s or float("nan")) * 1e3,
        "cloud_ms": cloud_ms,
    }


async def saturation(b: Bench, clients: int) -> dict[str, Any]:
    body = {"model": "bench-local", "messages": ASK, "stream": True, "max_tokens": 16}

    async def one() -> str:
        try:
            async with b.http.stream(
                "POST", f"{b.url}/chat/completions", json=body, headers=b.headers
            ) as r:
                if r.status_code == 429:
                    return "429" if r.headers.get("retry-after") else "429 without Retry-After"
                lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
                return (
                    "answered" if r.status_code == 200 and lines[-1] == "data: [DONE]" else "lost"
                )
        except Exception as exc:  # counted, not raised: "lost" is a figure
            return f"lost: {type(exc).__name__}"

    outcomes = await asyncio.gather(*(one() for _ in range(clients)))
    return {o: outcomes.count(o) for o in sorted(set(outcomes))} | {"clients": clients}


async def main_async(args: argparse.Namespace, cloud_port: int) -> dict[str, Any]:
    import httpx
    import uvicorn

    from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
    from hybridllm.gateway.app import create_app
    from hybridllm.gateway.limits import GatewayLimits
    from hybridllm.testing import FaultProxy, Faults
    from hybridllm.testing.server import free_port

    policies = Path(args.workdir)
    for name, text in POLICIES.items():
        (policies / f"{name}.toml").write_text(text)
    local = LlamaCppEngine(LOCAL, n_threads=args.threads, warm_up=True)
    with FaultProxy(upstream=("127.0.0.1", cloud_port), faults=Faults()) as proxy:
        cloud = OpenAIEngine(base_url=f"{proxy.url}/v1", api_key=CLOUD_KEY, model="stand-in")
        client = HybridClient(local=local, cloud=cloud, router=None, policy_dirs=[policies])
        limits = GatewayLimits(max_concurrency=args.limit)
        port = free_port()
        app = create_app(client, limits, api_key=KEY)
        config = uvicorn.Config(app, port=port, log_level="warning", access_log=False)
        server = uvicorn.Server(config)  # its lifespan opens the client in this loop
        task = asyncio.create_task(server.serve())
        await until(lambda: server.started)
        url = f"http://127.0.0.1:{port}/v1"
        limits_ = httpx.Limits(max_connections=args.clients + 4)
        async with httpx.AsyncClient(timeout=300.0, limits=limits_) as http:
            b = Bench(client, url, proxy, http)
            out = {
                "cpu": cpu_model(),
                "threads": args.threads,
                "overhead": await overhead(b, args.runs, args.max_tokens),
                "disconnect": await disconnects(b, local, args.repeats),
                "saturation": {"limit": args.limit, **await saturation(b, args.clients)},
            }
        server.should_exit = True
        await task
    return out


def render(res: dict[str, Any]) -> str:
    o, d, s = res["overhead"], res["disconnect"], res["saturation"]
    g, p = o["gateway"], o["in_process"]
    lines = [
        f"bench_gateway on {res['cpu']} (local engine {res['threads']} thread(s))",
        f"overhead, P50 of {o['runs']} interleaved runs:",
        f"  TTFT      gateway {g['ttft_ms_p50']:8.1f} ms   in process {p['ttft_ms_p50']:8.1f} ms"
        f"   difference {o['ttft_overhead_ms']:+.1f} ms",
        f"  tokens/s  gateway {g['tokens_per_s_p50']:8.1f}      in process "
        f"{p['tokens_per_s_p50']:8.1f}      ratio {o['throughput_ratio']:.3f}",
        "disconnect (socket close) to engine stop:",
        f"  local  P50 {p50(d['local_ms']):6.1f} ms  max {max(d['local_ms']):6.1f} ms"
        f"  (one decode step {d['local_decode_step_ms']:.1f} ms)",
        f"  cloud  P50 {p50(d['cloud_ms']):6.1f} ms  max {max(d['cloud_ms']):6.1f} ms",
        f"saturation: {s['clients']} streaming clients, limit {s['limit']}: "
        + ", ".join(f"{k} {v}" for k, v in s.items() if k not in ("clients", "limit")),
    ]
    return "\n".join(lines)


def main() -> None:
    import tempfile

    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import HybridServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="interleaved overhead runs per side")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5, help="disconnects per engine")
    ap.add_argument("--threads", type=int, default=1, help="the local engine's threads")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # two models share the cores
    resolve_model(LOCAL, pull=True)
    standin = resolve_model(STANDIN, pull=True)
    with (
        tempfile.TemporaryDirectory() as workdir,
        HybridServer(
            standin, alias="stand-in", api_key=CLOUD_KEY, n_ctx=1024, n_threads=1
        ) as cloud,
    ):
        args.workdir = workdir
        res = asyncio.run(main_async(args, cloud.port))
    report(res, render, args.json)


if __name__ == "__main__":
    main()
