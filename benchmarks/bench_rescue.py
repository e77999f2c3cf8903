"""The rescue on time (issue 45, item 3): is the local rescue's first token ready at the deadline?

    PYTHONPATH=. .venv/bin/python benchmarks/bench_rescue.py [--clients 3] [--requests 5]
        [--warm 3] [--deadline-ms 600] [--json PATH]

A cloud-first policy (`prefer = "cloud"`, `ttft_deadline_ms` 600) against a cloud that stalls
every first byte 5 s (the project's `serve-model` on SmolLM2-135M behind a `FaultProxy`; by
default, `--stall proxy`, the proxy holds the request 5 s and answers 500 without asking the
server, as a cloud stalled elsewhere costs the device nothing; `--stall upstream` forwards it and
holds the server's answer, whose work then runs on this machine): every
answer is the local engine's rescue, which starts its lead before the deadline (the p95 of its
predicted TTFT), parks at its first token and is released at the deadline. Per fresh client
(`--clients`): `--warm` local-only turns first (`engine="local"`: the latency model learns from
warm, cached turns), then `--requests` cloud-first requests on new prompts. The local engine is
Qwen2.5-Coder-0.5B (`LlamaCppEngine`, `--threads` 1), greedy, max_tokens 8. By default (`--pin`)
the stand-in cloud has CPU 1 to itself and everything else runs on CPU 0, as a cloud off the
device would; `--no-pin` shares both cores (then the rescue runs beside the cloud's work, a
load its warm turns never saw).

Reported: each rescued first token's time after the call, its lateness past the deadline
(target: every one within the deadline + 50 ms), who answered, the rescue's start (the
`Fallback` event's time: its lead before the deadline), and the rescue's own time to its first
token from its start (where it parked) beside the TTFT predicted for it. The answers are all
the local engine's, graded nowhere: the point is when the first token comes, not where from.
Other processes on the cores slow llama.cpp many times over: run it on quiet cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import anyio

from benchmarks._report import cpu_model, report
from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults, HybridServer

API_KEY, ALIAS = "sk-bench", "cloud"
WARM = ["Say hi.", "Name a colour.", "What is 2 + 2?", "Name a fruit.", "Name one planet."]
ASKED = [
    "Give me a word that rhymes with cat.",
    "What is the capital of France?",
    "Translate 'thank you' into Spanish.",
    "Is water wet? Answer briefly.",
    "Name a large animal that lives in the sea.",
    "What colour is the sky on a clear day?",
    "Name a musical instrument with strings.",
    "How many legs does a spider have?",
]


CLOUD_CPU, DEVICE_CPU = 1, 0  # --pin: the stand-in cloud's core, and everything else's


class Pinned(HybridServer):
    def command(self, port: int) -> list[str]:
        return ["taskset", "-c", str(CLOUD_CPU), *super().command(port)]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def one(client: HybridClient, prompt: str, **kw: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    started: float | None = None
    async with client.stream(prompt, **kw) as s:
        async for e in s.events():
            if isinstance(e, Fallback) and started is None:
                started = (time.perf_counter() - t0) * 1e3
            if isinstance(e, Token) and first is None:
                first = (time.perf_counter() - t0) * 1e3
    predicted = s.trace.predicted_ttft_ms.get("local")
    marks = s.trace.marks
    ready = marks.get("rescue_first_token", marks.get("first_token"))  # parked, or not
    own = None
    if ready is not None and "fallback_started" in marks:
        own = (ready - marks["fallback_started"]) * 1e3
    return {
        "ttft_ms": first,
        "engine": s.trace.engine,
        "rescue_start_ms": started,
        "predicted_local_ms": predicted,
        "rescue_ttft_ms": own,  # the rescue's own first token, from its start
    }


async def client_run(path: Any, url: str, args: argparse.Namespace, k: int) -> list[dict[str, Any]]:
    pol = Policy(
        name="rescue",
        routing={"prefer": "cloud", "ttft_deadline_ms": args.deadline_ms, "retries": 0},
        sampling={"max_tokens": 8, "temperature": 0},
        privacy={"mode": "off"},
    )
    local = LlamaCppEngine(path, n_ctx=2048, n_threads=args.threads)
    cloud = OpenAIEngine(base_url=url, api_key=API_KEY, model=ALIAS)
    rows = []
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        for prompt in WARM[: args.warm]:
            await one(client, prompt, engine="local")
        for i in range(args.requests):
            prompt = ASKED[(k * args.requests + i) % len(ASKED)]
            row = await one(client, prompt) | {"client": k, "i": i}
            row["late_ms"] = None if row["ttft_ms"] is None else row["ttft_ms"] - args.deadline_ms
            log(f"  client {k} request {i}: {row}")
            rows.append(row)
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    cloud_path = resolve_model("smollm2-135m-instruct", pull=True)
    rows: list[dict[str, Any]] = []
    server = Pinned if args.pin else HybridServer
    with server(cloud_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024, n_threads=1) as srv:
        # "proxy": the proxy answers 500 after the stall without asking the server (a stalled
        # cloud's work is elsewhere); "upstream": the server computes the answer the proxy holds
        http = 500 if args.stall == "proxy" else None
        faults = Faults(first_byte_stall_ms=5000.0, http_status=http)
        with FaultProxy(upstream=("127.0.0.1", srv.port), faults=faults) as proxy:
            for k in range(args.clients):
                rows += await client_run(path, proxy.url + "/v1", args, k)
    late = [r["late_ms"] for r in rows if r["late_ms"] is not None]
    return {
        "cpu": cpu_model(),
        "deadline_ms": args.deadline_ms,
        "rows": rows,
        "n": len(rows),
        "local": sum(r["engine"] == "local" for r in rows),
        "within_50ms": sum(x <= 50 for x in late),
        "late_p50_ms": round(statistics.median(late), 1) if late else None,
        "late_max_ms": round(max(late), 1) if late else None,
    }


def render(res: dict[str, Any]) -> str:
    lines = [f"CPU: {res['cpu']}", f"deadline {res['deadline_ms']} ms", ""]
    lines.append(
        "client  req  engine  rescue start ms  its TTFT ms (predicted)  first token ms"
        "  past the deadline ms"
    )
    for r in res["rows"]:
        start = "-" if r["rescue_start_ms"] is None else f"{r['rescue_start_ms']:.0f}"
        ttft = "-" if r["ttft_ms"] is None else f"{r['ttft_ms']:.0f}"
        late = "-" if r["late_ms"] is None else f"{r['late_ms']:+.0f}"
        own = "-" if r["rescue_ttft_ms"] is None else f"{r['rescue_ttft_ms']:.0f}"
        own += f" ({r['predicted_local_ms'] or 0:.0f})"
        lines.append(
            f"{r['client']:>6} {r['i']:>4}  {r['engine']:<6} {start:>16} {own:>24} {ttft:>15}"
            f" {late:>21}"
        )
    lines.append("")
    lines.append(
        f"within the deadline + 50 ms: {res['within_50ms']}/{res['n']}; answered locally "
        f"{res['local']}/{res['n']}; past the deadline P50 {res['late_p50_ms']} ms, "
        f"max {res['late_max_ms']} ms"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--deadline-ms", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1, help="the local engine's threads")
    ap.add_argument(
        "--no-pin", dest="pin", action="store_false", help="share both cores (no taskset)"
    )
    ap.add_argument("--stall", choices=["proxy", "upstream"], default="proxy")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.pin:  # before any thread starts: this process and its threads on DEVICE_CPU
        os.sched_setaffinity(0, {DEVICE_CPU})
    report(anyio.run(run, args), render, args.json)


if __name__ == "__main__":
    main()
