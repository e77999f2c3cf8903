"""Record real request traces from the real engines, for replaying the latency model.

    python benchmarks/record_traces.py [--n 40] [--out benchmarks/traces/real.jsonl]
                                      [--local-model NAME] [--cloud-model NAME] [--seed 1]

The local engine is `LlamaCppEngine` (Qwen2.5-Coder-0.5B by default, one thread); the "cloud" is
the real `llama_cpp.server` (SmolLM2-135M by default, one thread) on loopback behind a
`FaultProxy` that adds a heavy-tailed first-byte delay (lognormal, median 150 ms, p99 1.5 s)
and, for the second half of the cloud requests, 600 ms more (a cloud getting slower). Prompts
run from a few to about 600 tokens; every few local requests two are sent at once, so some wait
in the local queue. Each request is forced to one engine (every engine gets traces).

Each line of the output is one request: the engine, the client's prompt-token estimate, the
local engine's expected queue wait and its own TTFT estimate at the call, the trace's phase
marks (ms since the call), TTFT, TPOT, tokens, usage and the phase ("steady"/"slower"). The
first line holds the local engine's warm-up figures.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import anyio

from hybridllm import HybridClient, Policy
from hybridllm.engines import GenerationRequest, LlamaCppEngine, OpenAIEngine
from hybridllm.engines.base import estimate_prompt_tokens
from hybridllm.errors import HybridError
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults, LlamaServer
from hybridllm.testing.faults import heavy_tail

API_KEY = "sk-traces"
ALIAS = "cloud"
TEXT = (
    "The history of computing is a story of layers: each generation of machines hides the "
    "details of the one before behind a simpler interface, and each interface becomes the "
    "foundation for the next. "
)
QUESTIONS = [
    "Summarise the text above in one sentence.",
    "What is the main idea?",
    "Give it a title.",
    "Name one word from it.",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompt(rng: random.Random) -> str:
    reps = rng.choice([0, 0, 1, 2, 4, 8, 12, 16])
    return (TEXT * reps) + rng.choice(QUESTIONS)


async def one(client: HybridClient, engine: str, text: str, phase: str) -> dict[str, object]:
    messages = [{"role": "user", "content": text}]
    local = client.local
    wait = local.expected_wait_s() if isinstance(local, LlamaCppEngine) else None
    own = None
    if engine == "local" and local is not None:
        own = local.predict_ttft_s(GenerationRequest(messages))
    row: dict[str, object] = {
        "engine": engine,
        "phase": phase,
        "prompt_tokens_est": estimate_prompt_tokens(messages),
        "prompt": text,
        "expected_wait_s": wait if engine == "local" else 0.0,
        "engine_predicted_ttft_s": own,
    }
    try:
        res = await client.complete(text, engine=engine)  # type: ignore[arg-type]
        tr = res.trace
    except HybridError as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    row.update(
        marks_ms=tr.segments_ms,
        ttft_ms=tr.ttft_ms,
        tpot_ms=tr.tpot_ms,
        n_tokens=tr.n_tokens,
        prompt_tokens=tr.prompt_tokens,
        cached_prompt_tokens=tr.cached_prompt_tokens,
        model_predicted_ttft_ms=tr.predicted_ttft_ms.get(engine),
    )
    return row


async def main(args: argparse.Namespace) -> list[dict[str, object]]:
    rng = random.Random(args.seed)
    local_path = resolve_model(args.local_model, pull=True)
    cloud_path = resolve_model(args.cloud_model, pull=True)
    steady = heavy_tail(median_ms=150, p99_ms=1500)
    rows: list[dict[str, object]] = []
    policy = Policy(
        name="traces",
        sampling={"max_tokens": args.max_tokens, "temperature": 0},
        routing={"retries": 0},
    )
    with (
        LlamaServer(cloud_path, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as server,
        FaultProxy(upstream=("127.0.0.1", server.port)) as proxy,
    ):
        local = LlamaCppEngine(local_path, n_ctx=2048, n_threads=1)
        cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
        async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
            head = {"warm_up": {"prefill_tps": local.prefill_tps, "tpot_s": local.tpot_s}}
            log(f"local warm-up: {head['warm_up']}")
            for i in range(args.n):
                phase = "steady" if i < args.n // 2 else "slower"
                extra = 0.0 if phase == "steady" else 600.0
                delay = steady(rng) + extra
                proxy.faults = Faults(first_byte_stall_ms=delay)
                rows.append(await one(client, "cloud", prompt(rng), phase))
                if i % 5 == 4:  # two local requests at once: the second one queues
                    async with anyio.create_task_group() as tg:
                        pair: list[dict[str, object]] = []

                        async def go(text: str, out: list[dict[str, object]] = pair) -> None:
                            out.append(await one(client, "local", text, "steady"))

                        tg.start_soon(go, prompt(rng))
                        await anyio.sleep(0.05)
                        tg.start_soon(go, prompt(rng))
                    rows.extend(pair)
                else:
                    rows.append(await one(client, "local", prompt(rng), "steady"))
                last = rows[-1]
                log(f"{i + 1}/{args.n}: local ttft {last.get('ttft_ms')} ms")
    return [head, *rows]


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=40, help="rounds (one cloud + one or two local)")
    p.add_argument("--out", default="benchmarks/traces/real.jsonl")
    p.add_argument("--local-model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--cloud-model", default="smollm2-135m-instruct")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rows = anyio.run(main, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    log(f"{len(rows) - 1} traces -> {out}")


if __name__ == "__main__":
    cli()
