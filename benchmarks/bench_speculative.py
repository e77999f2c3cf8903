"""Speculative plan benchmark: local drafts, cloud verifies, against cloud-only and local-only.

    python benchmarks/bench_speculative.py --cloud-url http://127.0.0.1:8000/v1 --cloud-model M
    python benchmarks/bench_speculative.py --serve [--cloud qwen2.5-coder-1.5b-instruct]
    python benchmarks/bench_speculative.py --quick        # SmolLM2 for SmolLM2, 0 and 50 ms

The cloud is an OpenAI-compatible endpoint answering a verification dialect (vLLM's
`prompt_logprobs`, or llama-cpp-python's echo + logprobs, which is correct but far too slow to
time: see DESIGN.md). `--cloud-url` uses a running one; `--serve` starts one: the project's own
server (`hybridllm serve-model`, `HybridServer`), or with `--echo` `llama_cpp.server`. A
`FaultProxy`
between the SDK and the server adds the round trip (0, 20, 50, 100 ms by default).

Per RTT and prompt kind (code, prose), for the speculative plan: acceptance, accepted tokens per
round trip, cloud calls and cloud decode steps per 100 output tokens, billed prompt tokens per
100 output tokens, time to the first draft and to the first committed token, and total time for
`--tokens` tokens (128); beside it the plan at a fixed k = 8 (`speculative_k`, the reference: it
never steps aside), the same without shown drafts (`spec-k8-r0`: round 0 first) and without
drafting ahead during verification (`spec-k8-seq`), cloud-only and local-only, in the same run.
The adaptive plan runs without shown drafts. Each client first makes one plain cloud request (not
timed) so the adaptive plan judges its pay against the cloud's measured speed (`--cold`: the
latency model's prior stands in), and before each timed request one that evicts the prompt from
the server's KV prefix, so every mode starts from the same cold prefill. By default both models
share this machine's cores, which a real device and cloud do not; `--pin` gives each one core
and one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # two models on the same cores
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402

from hybridllm import (  # noqa: E402
    HybridClient,
    LlamaCppEngine,
    ModelPrice,
    OpenAIEngine,
    Policy,
    Prices,
    SQLiteLedger,
)
from hybridllm.engines.openai_engine import Continuation  # noqa: E402
from hybridllm.events import Done, Draft  # noqa: E402
from hybridllm.local.resolve import resolve_model  # noqa: E402
from hybridllm.testing import FaultProxy, Faults, HybridServer, LlamaServer  # noqa: E402

PROMPTS = {
    "code": "Write a Python function that checks whether a string is a palindrome.",
    "prose": "Describe the water cycle in a short paragraph.",
}


@contextlib.contextmanager
def served(model: str, pin: bool = False, echo: bool = False) -> Iterator[tuple[str, str]]:
    """(base_url, model name) of a started stand-in cloud: the project's own fast server
    (`hybridllm serve-model`), or with `echo` llama_cpp.server (dialect (a), correct but far too
    slow to time). `pin`: one thread on CPU 1 (the child inherits this process's affinity at start;
    this process then moves to CPU 0, where the local engine runs with one thread)."""
    path = resolve_model(model)
    if echo:
        extra = ["--logits_all", "true"]
        with LlamaServer(path, alias="cloud", n_ctx=2048, extra_args=extra) as s:
            yield s.base_url, "cloud"
        return
    if not pin:
        with HybridServer(path, alias="cloud") as s:
            yield s.base_url, "cloud"
        return
    os.sched_setaffinity(0, {1})
    try:
        with HybridServer(path, alias="cloud", n_threads=1) as s:
            os.sched_setaffinity(0, {0})
            yield s.base_url, "cloud"
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


async def per_rtt(
    url: str,
    model: str,
    local: str,
    modes: list[str],
    tokens: int,
    warm: bool,
    threads: int | None,
    continuation: Continuation,
) -> list[dict[str, Any]]:
    """One client per round trip: a short first request probes the dialect (not timed)."""
    prices = Prices(models={model: ModelPrice(input_per_million=1.0, output_per_million=1.0)})
    client = HybridClient(
        LlamaCppEngine(local, n_threads=threads),
        OpenAIEngine(base_url=url, api_key="none", model=model, continuation=continuation),
        router=None, prices=prices, ledger=SQLiteLedger(),
    )  # fmt: skip
    rows = []
    async with client:  # warm-up, not timed: probe the dialect; the cloud's plain speed
        await client.complete("Hi.", plan="speculative", max_tokens=2, temperature=0)
        if warm:
            await client.complete("Count from 1 to 20.", engine="cloud", max_tokens=24)
        for kind, prompt in PROMPTS.items():
            for mode in modes:  # evict the prompt from the server's KV prefix first: each
                # mode starts with the same cold prefill
                await client.complete("Say OK.", engine="cloud", max_tokens=1, temperature=0)
                r = await one(client, mode, prompt, tokens)
                r["kind"] = kind
                rows.append(r)
                print(json.dumps(r), flush=True)
    return rows


async def one(client: HybridClient, mode: str, prompt: str, tokens: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_tokens": tokens, "temperature": 0}
    if mode == "speculative":  # adaptive; drafts not shown, so it starts with round 0
        kw.update(plan="speculative", show_drafts=False)
    elif mode.startswith("spec-k"):  # a fixed k: the reference (no stepping aside); "-seq":
        # no drafting ahead during verification; "-r0": drafts not shown (round 0 first)
        k, *flags = mode.removeprefix("spec-k").split("-")
        pol = Policy(name=mode, speculative={"k": int(k), "ahead": "seq" not in flags})
        kw.update(policy=pol, plan="speculative", show_drafts="r0" not in flags)
    else:
        kw["engine"] = mode
    t0 = time.perf_counter()
    first_draft = None
    async with client.stream(prompt, **kw) as s:
        async for e in s.events():
            if isinstance(e, Draft) and first_draft is None:
                first_draft = e.t - s.trace.t_start
            if isinstance(e, Done):
                break
    total = time.perf_counter() - t0
    tr = s.trace
    n = max(1, tr.completion_tokens or tr.n_tokens)
    out: dict[str, Any] = {
        "mode": mode, "tokens": n, "total_s": round(total, 2),
        "ttft_ms": round(tr.ttft_ms or 0), "error": tr.error,
        "first_draft_ms": None if first_draft is None else round(first_draft * 1e3),
        "billed_prompt_per_100": round(100 * sum(x.prompt_tokens for x in tr.spent) / n),
    }  # fmt: skip
    sp = tr.speculation
    if sp is not None:
        plain_calls = 1 if sp.switched or sp.unverified is not None else 0
        out.update(
            verifier=sp.verifier, rounds=sp.rounds, k=sp.k,
            acceptance=None if sp.acceptance is None else round(sp.acceptance, 2),
            tokens_per_round=round(n / sp.rounds, 2) if sp.rounds else None,
            cloud_calls_per_100=round(100 * (sp.rounds + plain_calls) / n, 1),
            # each round decodes one token at the cloud; a switch streams the rest plainly
            cloud_decode_per_100=round(100 * (sp.rounds + (n - sp.accepted - sp.rounds
                                       if plain_calls else 0)) / n, 1),
            verify_ms_median=round(statistics.median(sp.verify_ms)) if sp.verify_ms else None,
            switched=sp.switched, switched_at=sp.switched_at, ahead_used=sp.ahead_used,
        )  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cloud-url", help="a running OpenAI-compatible server's /v1 URL")
    ap.add_argument("--cloud-model", default="cloud")
    ap.add_argument("--serve", action="store_true", help="start a stand-in cloud")
    ap.add_argument("--cloud", default="qwen2.5-coder-1.5b-instruct", help="model for --serve")
    ap.add_argument("--local", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rtt", default="0,20,50,100", help="added round trips in ms")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--modes", default="speculative,spec-k8,spec-k8-r0,spec-k8-seq,cloud,local")
    ap.add_argument(
        "--pin", action="store_true",
        help="device and cloud on a core each, one thread each (as on separate hardware)",
    )  # fmt: skip
    ap.add_argument("--echo", action="store_true", help="serve with llama_cpp.server")
    ap.add_argument(
        "--continuation", choices=["instruction", "continue_final_message"],
        help="how plain streaming continues the committed text (default: continue_final_message "
        "against hybridllm serve-model, else instruction)",
    )  # fmt: skip
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no plain cloud request before timing (the "
        "adaptive plan then judges its pay against the latency model's prior)",
    )
    ap.add_argument("--quick", action="store_true", help="SmolLM2 both sides, 0 and 50 ms, 32")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.cloud = args.local = "smollm2-135m-instruct"
        args.rtt, args.tokens, args.serve = "0,50", 32, args.cloud_url is None
    rtts = [float(x) for x in args.rtt.split(",")]
    with contextlib.ExitStack() as stack:
        if args.cloud_url:
            url, model = args.cloud_url, args.cloud_model
        else:
            url, model = stack.enter_context(served(args.cloud, args.pin, args.echo))
        served_here = not args.cloud_url and not args.echo
        continuation: Continuation = args.continuation or (
            "continue_final_message" if served_here else "instruction"
        )
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        rows = []
        where = "a core and a thread each" if args.pin else "both on this machine's 2 cores"
        print(f"# local {args.local}, cloud {model} at {url}; {where}")
        for rtt in rtts:
            modes = [m for m in args.modes.split(",") if m != "local" or rtt == rtts[0]]
            print(f"## added round trip {rtt:g} ms")
            with FaultProxy(upstream=(host, int(port)), faults=Faults(latency_ms=rtt)) as proxy:
                got = anyio.run(
                    per_rtt, proxy.url + "/v1", model, args.local, modes, args.tokens,
                    not args.cold, 1 if args.pin else None, continuation,
                )  # fmt: skip
            rows += [{**r, "rtt_ms": rtt} for r in got]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
