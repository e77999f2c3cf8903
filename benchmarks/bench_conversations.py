"""Conversations that stay warm (issue 28): TTFT per turn, memory and the warm start.

    PYTHONPATH=. python benchmarks/bench_conversations.py [--turns 6] [--convs 4] [--quick]

Four conversations interleaved (round robin), six turns each, one shared system prompt of about
300 tokens, answers of up to 48 tokens, greedy, Qwen 0.5B local. In the same run:

  (a) one conversation alone: the reference;
  (b) the four interleaved with the live KV cache only (as before: `kv_cache_bytes=0`);
  (c) the four interleaved with saved KV states (`kv_cache_bytes`, the default);
  (d) the four interleaved, every second turn served by the stand-in cloud (SmolLM2 behind
      `hybridllm serve-model`, one thread), the local engine prefilling each cloud turn in the
      background (continuity); only the local turns' TTFT is compared;
  (e) the first request after a restart: a fresh engine, the system prompt and a short
      question, with the system prompt's state on disk (warm start) and without, against the
      short question alone.

Printed: TTFT P50 / P95 per turn index for each variant and its ratio to (a) (target: within
1.2x for (c) and (d)), the cached prompt tokens, the RAM the saved states use against the
budget, the bytes of a state per 1,000 tokens and the restore cost in ms per 1,000 tokens.
One second passes between turns (a person reads and types), in every variant.
Greedy answers differ between variants (the cache state changes llama.cpp's rounding), so each
variant has its own histories; TTFT is judged per turn index, not per text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anyio.lowlevel
from bench_telemetry import cpu_name  # noqa: E402

from hybridllm import HybridClient, Policy  # noqa: E402
from hybridllm.engines import LlamaCppEngine, OpenAIEngine  # noqa: E402
from hybridllm.local.resolve import resolve_model  # noqa: E402
from hybridllm.testing import HybridServer  # noqa: E402

SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a shop for hiking and camping gear. "
    "Answer in two or three short sentences. Be friendly and precise. Never invent prices, "
    "stock levels or order numbers; if you do not know, say so and offer to check. The shop "
    "ships within the EU in three to five working days; returns are free within 30 days if "
    "the item is unused and in its box. Tents come with a two-year warranty, boots with one "
    "year. Customers may pay by card or bank transfer. The shop is open Monday to Saturday, "
    "nine to six. Repairs of zips, poles and seams take about two weeks. Gift cards never "
    "expire. Members of the Northwind club get ten percent off and free repairs. "
) * 2
QUESTIONS = [
    "Do you ship to Norway?",
    "How long does a zip repair take?",
    "Can I return boots I wore once?",
    "What warranty does a tent have?",
    "Do gift cards expire?",
    "Are you open on Sundays?",
    "What does the club cost?",
    "Can I pay by bank transfer?",
]
API_KEY = "sk-bench"
THINK_S = 1.0  # seconds between a turn's answer and the next turn (any conversation)
# a cloud turn as an app gets one: its policy prefers the cloud (a turn the caller forces to the
# cloud with engine="cloud" is not warmed locally: the caller said where its turns go)
CLOUD_TURN = Policy.model_validate(
    {"name": "cloud-turn", "routing": {"prefer": "cloud", "ttft_deadline_ms": 30_000}}
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def converse(
    client: HybridClient, n_convs: int, turns: int, cloud_every: int
) -> dict[int, list[dict[str, Any]]]:
    """Round robin over `n_convs` conversations; turn t goes to the cloud when `cloud_every`
    and t % cloud_every == 1. Returns, per turn index, each local turn's figures."""
    convs = [[{"role": "system", "content": SYSTEM}] for _ in range(n_convs)]
    out: dict[int, list[dict[str, Any]]] = {t: [] for t in range(turns)}
    for t in range(turns):
        for c, conv in enumerate(convs):
            conv.append({"role": "user", "content": QUESTIONS[(t + c) % len(QUESTIONS)]})
            engine = "cloud" if cloud_every and t % cloud_every == 1 else "local"
            where: dict[str, Any] = (
                {"policy": CLOUD_TURN} if engine == "cloud" else {"engine": engine}
            )
            async with client.stream(conv, max_tokens=48, temperature=0.0, **where) as s:
                text = "".join([x async for x in s])
            conv.append({"role": "assistant", "content": text})
            await anyio.sleep(THINK_S)  # the user reads and types: the device may be idle
            tr = s.trace
            if engine == "local":
                out[t].append(
                    {
                        "ttft": tr.ttft_ms,
                        "cached": tr.cached_prompt_tokens or 0,
                        "prompt": tr.prompt_tokens or 0,
                    }
                )
    return out


def report(
    name: str, got: dict[int, list[dict[str, Any]]], ref: dict[int, list[dict[str, Any]]] | None
) -> None:
    print(f"\n{name}")
    print("turn  n   TTFT P50   P95     | ratio to (a) P50  P95 | cached / prompt tokens")
    for t, rows in got.items():
        if not rows:
            continue
        ttfts = [r["ttft"] for r in rows]
        p50, p95 = pct(ttfts, 0.5), pct(ttfts, 0.95)
        ratio = ""
        if ref is not None and ref.get(t):
            r_t = [r["ttft"] for r in ref[t]]
            ratio = f"{p50 / pct(r_t, 0.5):5.2f} {p95 / pct(r_t, 0.95):5.2f}"
        cached = statistics.mean(r["cached"] for r in rows)
        prompt = statistics.mean(r["prompt"] for r in rows)
        print(
            f"{t:4} {len(rows):2} {p50:9.0f} {p95:7.0f}     | {ratio:>21} |"
            f" {cached:5.0f} / {prompt:5.0f}"
        )


async def variant(
    model: str, convs: int, turns: int, kv_bytes: int, cloud: OpenAIEngine | None = None
) -> tuple[dict[int, list[dict[str, Any]]], Any]:
    with tempfile.TemporaryDirectory() as disk:
        local = LlamaCppEngine(model, kv_cache_bytes=kv_bytes, kv_disk_dir=disk)
        async with HybridClient(local=local, cloud=cloud, router=None) as client:
            got = await converse(client, convs, turns, 2 if cloud is not None else 0)
            kv = local._session.kv if local._session is not None else None
            return got, kv


async def restart(model: str) -> None:
    """(e): a fresh engine's first request, with and without the system prompt on disk; and,
    as the floor, the same request to an engine whose live KV cache holds the system prompt
    (attention over the cached prefix costs what no restore can save)."""
    ask = [{"role": "user", "content": QUESTIONS[0]}]
    full = [{"role": "system", "content": SYSTEM}, *ask]
    names = [
        "question alone",
        "cold (no state on disk)",
        "warm start (state on disk)",
        "floor: system prompt live in the cache",
    ]
    rows: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as disk:
        await first_request(model, full, disk, 2**28)  # an earlier process writes the state
        for _ in range(3):
            rows[names[0]].append(await first_request(model, ask, disk, 0))
            rows[names[1]].append(await first_request(model, full, disk, 0))
            rows[names[2]].append(await first_request(model, full, disk, 2**28))
            rows[names[3]].append(await first_request(model, full, disk, 0, after=QUESTIONS[1]))
    print("\n(e) the first request after a restart (TTFT, ms, median of 3 fresh engines)")
    base = statistics.median(rows[names[0]])
    for name, values in rows.items():
        mid = statistics.median(values)
        print(f"  {name:40} {mid:7.0f}   {mid / base:5.2f}x")


async def first_request(
    model: str, messages: list[dict[str, str]], disk: str, disk_bytes: int, after: str = ""
) -> float:
    """A fresh engine's TTFT for `messages` (`after`: first ask this question with the same
    system prompt, so the live cache holds it)."""
    local = LlamaCppEngine(model, kv_disk_dir=disk, kv_disk_bytes=disk_bytes)
    async with HybridClient(local=local, router=None) as client:
        if after:
            before = [*messages[:-1], {"role": "user", "content": after}]
            async with client.stream(before, max_tokens=1, temperature=0.0) as s:
                _ = [x async for x in s]
        async with client.stream(messages, max_tokens=8, temperature=0.0) as s:
            _ = [x async for x in s]
    assert s.trace.ttft_ms is not None
    return s.trace.ttft_ms


async def state_costs(model: str) -> None:
    """Bytes of a state and the restore's cost, per 1,000 tokens."""
    local = LlamaCppEngine(model)
    await local.start()
    session = local._session
    assert session is not None and session.kv is not None
    from hybridllm.engines.llama.thread import run_on_llama_thread

    def measure() -> tuple[int, float]:
        tokens = session.tokenize(SYSTEM * 2)[:1000]
        session.llm.reset()
        session.llm.eval(tokens)
        session._save_live(session.kv)
        state = session.kv.find(tokens)[0]
        t0 = time.perf_counter()
        for _ in range(5):
            session._restore(state)
        return state.nbytes * 1000 // len(state.tokens), (
            time.perf_counter() - t0
        ) / 5 * 1e3 * 1000 / len(state.tokens)

    nbytes, ms = await run_on_llama_thread(measure, on_cancel=lambda: None)
    await local.aclose()
    print(
        f"\nstate: {nbytes / 2**20:.1f} MiB per 1,000 tokens; restore {ms:.1f} ms per 1,000 tokens"
    )


async def main(args: argparse.Namespace) -> None:
    print(
        f"CPU: {cpu_name()}; local {args.model}; {args.convs} conversations x {args.turns} turns; "
        f"system prompt ~300 tokens; answers <= 48 tokens"
    )
    ref, _ = await variant(args.model, 1, args.turns, 2**28)
    report("(a) one conversation alone", ref, None)
    before, _ = await variant(args.model, args.convs, args.turns, 0)
    report("(b) interleaved, live KV cache only (before)", before, ref)
    warm, kv = await variant(args.model, args.convs, args.turns, 2**28)
    report("(c) interleaved, saved KV states", warm, ref)
    used = kv.bytes_used / 2**20
    print(f"    saved states: {len(kv.states)}, {used:.1f} MiB of a 256 MiB budget;", end=" ")
    print(f"hits {kv.hits}, evicted {kv.evicted}")

    path = resolve_model(args.cloud_model)
    with HybridServer(path, alias="cloud", api_key=API_KEY, n_ctx=4096, n_threads=1) as server:
        cloud = OpenAIEngine(base_url=server.base_url, api_key=API_KEY, model=server.model)
        mixed, _ = await variant(args.model, args.convs, args.turns, 2**28, cloud)
    report("(d) interleaved, every second turn on the cloud, continuity", mixed, ref)
    await restart(args.model)
    await state_costs(args.model)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--cloud-model", default="smollm2-135m-instruct")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--convs", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="2 conversations x 3 turns")
    ns = ap.parse_args()
    if ns.quick:
        ns.turns, ns.convs = 3, 2
    anyio.run(main, ns)
