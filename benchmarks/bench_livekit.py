"""The LiveKit adapter's figures (issue 30): LiveKit's own TTFT against the trace's on the same
requests, and interruption to engine stop.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_livekit.py [--n 4] [--model NAME]

Engines: the model in process (`LlamaCppEngine`, one thread) and the same model behind
`hybridllm serve-model` on loopback through a `FaultProxy` (the stand-in cloud), sharing the
machine's cores. Every request goes through `HybridLLM.chat()` in the real livekit-agents:
- TTFT: `--n` short requests per engine; LiveKit's `LLMMetrics.ttft` (its metrics task, from
  the stream's creation to the first chunk with content) beside `Trace.ttft_ms` (from the
  `stream()` call to the first token delivered) of the same request, matched by request id;
- interruption: `--n` long answers per engine and per way, cut after the third text chunk by
  `LLMStream.aclose()`, or by LiveKit's `AgentSession.interrupt()` once the agent is speaking;
  measured from that call to the engine's stop: the local engine no longer busy (polled every
  millisecond), the cloud connection closed by the client as the proxy saw it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from livekit.agents import Agent, AgentSession, llm, metrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import cpu_model  # noqa: E402
from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy  # noqa: E402
from hybridllm.integrations.livekit import HybridLLM  # noqa: E402
from hybridllm.local.resolve import resolve_model  # noqa: E402
from hybridllm.runtime.trace import Trace  # noqa: E402
from hybridllm.testing import FaultProxy, Faults, HybridServer  # noqa: E402

ALIAS, API_KEY = "stand-in", "sk-bench"
LONG = "Count from 1 to 500, separated by commas."
SHORT = ["Say hello.", "Name a colour.", "What is 2 + 2?", "Name a fruit.", "Say goodbye."]
ENGINES = ("local", "cloud")


def ask(text: str) -> llm.ChatContext:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content=text)
    return ctx


async def ttft_pairs(client: HybridClient, n: int) -> list[tuple[str, float, float]]:
    """(engine, LiveKit's ttft ms, the trace's ttft ms) per request."""
    out: list[tuple[str, float, float]] = []
    for engine in ENGINES:
        hybrid = HybridLLM(client=client, engine=engine, max_tokens=16)  # type: ignore[arg-type]
        measured: list[metrics.LLMMetrics] = []
        traces: list[Trace] = []
        hybrid.on("metrics_collected", measured.append)
        hybrid.on("hybridllm_trace", traces.append)
        for i in range(n):
            async with hybrid.chat(chat_ctx=ask(SHORT[i % len(SHORT)])) as stream:
                async for _ in stream:
                    pass
        by_id = {t.request_id: t for t in traces}
        for m in measured:
            trace = by_id[m.request_id]
            if m.ttft >= 0 and trace.ttft_ms is not None:
                out.append((engine, m.ttft * 1000, trace.ttft_ms))
    return out


async def stopped(engine: str, local: LlamaCppEngine, proxy: FaultProxy) -> float:
    """When the engine let go (monotonic): the local one no longer busy, the cloud connection
    closed by the client."""
    if engine == "local":
        while local.busy:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        return time.monotonic()
    closed = await asyncio.to_thread(proxy.wait_client_closed, None, 10.0)
    if closed is None:
        raise RuntimeError("the cloud connection was never closed")
    return closed


async def cut_by_aclose(hybrid: HybridLLM) -> float:
    stream = hybrid.chat(chat_ctx=ask(LONG))
    for _ in range(3):
        await stream.__anext__()
    t0 = time.monotonic()
    await stream.aclose()
    return t0


async def cut_by_interrupt(hybrid: HybridLLM) -> float:
    speaking = asyncio.Event()
    async with AgentSession(llm=hybrid) as session:
        await session.start(Agent(instructions="You count."))
        session.on("agent_state_changed", lambda ev: ev.new_state == "speaking" and speaking.set())
        run = session.run(user_input=LONG)
        await asyncio.wait_for(speaking.wait(), 60)
        t0 = time.monotonic()
        await session.interrupt()
        await run
    return t0


async def interruptions(
    client: HybridClient, local: LlamaCppEngine, proxy: FaultProxy, n: int
) -> dict[tuple[str, str], list[float]]:
    """Milliseconds from the cut to the engine's stop, per (engine, way)."""
    ways: dict[str, Callable[[HybridLLM], Awaitable[float]]] = {
        "aclose()": cut_by_aclose,
        "AgentSession.interrupt()": cut_by_interrupt,
    }
    out: dict[tuple[str, str], list[float]] = {}
    for engine in ENGINES:
        hybrid = HybridLLM(client=client, engine=engine, max_tokens=400)  # type: ignore[arg-type]
        for way, cut in ways.items():
            for _ in range(n):
                t0 = await cut(hybrid)
                out.setdefault((engine, way), []).append(
                    (await stopped(engine, local, proxy) - t0) * 1000
                )
    return out


def render(pairs: list[tuple[str, float, float]], stops: dict[tuple[str, str], list[float]]) -> str:
    lines = [f"CPU: {cpu_model()}", "", "TTFT, the same requests (ms)"]
    lines.append(f"{'engine':8}{'LiveKit':>10}{'trace':>10}{'LiveKit - trace':>17}")
    for engine, livekit, trace in pairs:
        lines.append(f"{engine:8}{livekit:10.1f}{trace:10.1f}{livekit - trace:17.2f}")
    diffs = [abs(a - b) for _, a, b in pairs]
    lines.append(
        f"|LiveKit - trace|: median {statistics.median(diffs):.2f} ms, max {max(diffs):.2f} ms"
    )
    lines += ["", "interruption to engine stop (ms)"]
    lines.append(f"{'engine':8}{'by':26}{'median':>8}{'max':>8}{'n':>4}")
    for (engine, way), ms in stops.items():
        lines.append(f"{engine:8}{way:26}{statistics.median(ms):8.1f}{max(ms):8.1f}{len(ms):4}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    path = resolve_model(args.model, pull=True)
    with (
        HybridServer(path, alias=ALIAS, api_key=API_KEY, n_ctx=1024, n_threads=1) as server,
        FaultProxy(upstream=("127.0.0.1", server.port), faults=Faults()) as proxy,
    ):
        local = LlamaCppEngine(path, n_ctx=1024, n_threads=1, use_tuning=False)
        cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
        policy = Policy(name="bench", sampling={"temperature": 0.0})
        async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
            pairs = await ttft_pairs(client, args.n)
            stops = await interruptions(client, local, proxy, args.n)
    print(render(pairs, stops))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4, help="requests per engine (and per way)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    asyncio.run(main(parser.parse_args()))
