"""`hybridllm.integrations.livekit.HybridLLM` in the real livekit-agents package, text in and
text out, no LiveKit server: LiveKit's own `AgentSession.run` harness and its `LLM` API over
the real local engine (SmolLM2-135M) and the stand-in cloud behind a `FaultProxy`; the example
agent with its function tool on Qwen2.5-Coder 1.5B."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from livekit.agents import Agent, AgentSession, llm, metrics

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.integrations.livekit import HybridLLM, HybridLLMStream
from hybridllm.runtime.trace import Trace
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
LONG = "Count from 1 to 500, separated by commas."
LOCAL = Policy(name="local-first", routing={"prefer": "local"}, sampling={"max_tokens": 400})


def local_engine(model_path: Path) -> LlamaCppEngine:
    return LlamaCppEngine(model_path, n_ctx=1024, n_threads=1, warm_up=False, use_tuning=False)


def cloud_engine(proxy: FaultProxy) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)


def ask(text: str) -> llm.ChatContext:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content=text)
    return ctx


async def wait_until_free(engine: LlamaCppEngine) -> None:
    """The local engine let go (bounded; no event to wait on: the engine's own state)."""
    with anyio.fail_after(10):
        while engine.busy:  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def closed_at(proxy: FaultProxy) -> float | None:
    return await anyio.to_thread.run_sync(lambda: proxy.wait_client_closed(timeout=5.0))


async def test_a_reply_streams_as_chat_chunks_with_the_route_and_livekits_metrics(
    model_path: Path,
) -> None:
    local = local_engine(model_path)
    async with HybridClient(local=local, policy=LOCAL, router=None) as client:
        hybrid = HybridLLM(client=client, max_tokens=24)
        collected: list[metrics.LLMMetrics] = []
        traces: list[Trace] = []
        hybrid.on("metrics_collected", collected.append)
        hybrid.on("hybridllm_trace", traces.append)
        async with hybrid.chat(chat_ctx=ask("Say hello.")) as stream:
            chunks = [chunk async for chunk in stream]
    text = "".join(c.delta.content or "" for c in chunks if c.delta)
    assert text.strip()
    trace = stream.trace
    assert trace is not None and traces == [trace] and trace.engine == "local"
    assert {c.id for c in chunks} == {trace.request_id}
    last = chunks[-1]
    assert last.delta is not None and last.delta.extra is not None
    route = last.delta.extra["hybridllm"]
    assert route["engine"] == "local" and route["route_reason"] == trace.route_reason
    usage = next(c.usage for c in chunks if c.usage is not None)
    assert usage.completion_tokens == trace.completion_tokens
    # LiveKit measured this very request from the chunks: its id, its usage, a first token
    [measured] = collected
    assert measured.request_id == trace.request_id and measured.ttft > 0
    assert measured.completion_tokens == trace.completion_tokens and trace.ttft_ms is not None


async def test_aclose_lets_the_local_engine_go(model_path: Path) -> None:
    local = local_engine(model_path)
    async with HybridClient(local=local, policy=LOCAL, router=None) as client:
        stream = HybridLLM(client=client, engine="local").chat(chat_ctx=ask(LONG))
        got = [await stream.__anext__() for _ in range(3)]
        assert local.busy and all(c.delta and c.delta.content for c in got)
        await stream.aclose()
        await wait_until_free(local)
        assert isinstance(stream, HybridLLMStream) and stream.trace is not None
        assert stream.trace.finish_reason != "stop" and stream.trace.n_tokens < 400


async def test_aclose_closes_the_cloud_connection(proxy: FaultProxy) -> None:
    async with HybridClient(cloud=cloud_engine(proxy), router=None) as client:
        stream = HybridLLM(client=client, engine="cloud", max_tokens=400).chat(chat_ctx=ask(LONG))
        for _ in range(3):
            await stream.__anext__()
        await stream.aclose()
        assert await closed_at(proxy) is not None, "the cloud never saw the disconnect"
        assert stream.trace is not None and stream.trace.engine == "cloud"


@pytest.mark.parametrize("engine", ["local", "cloud"])
async def test_a_session_interruption_stops_the_engine(
    engine: str, model_path: Path, proxy: FaultProxy
) -> None:
    """LiveKit's own interruption (`AgentSession.interrupt`) mid-reply, after the first text
    reached the agent: the local decode stops, or the cloud connection closes."""
    local = local_engine(model_path)
    async with HybridClient(local=local, cloud=cloud_engine(proxy), router=None) as client:
        hybrid = HybridLLM(client=client, engine=engine, max_tokens=400)  # type: ignore[arg-type]
        first_text = anyio.Event()
        traces: list[Trace] = []
        hybrid.on("hybridllm_trace", traces.append)
        async with AgentSession(llm=hybrid) as session:
            await session.start(Agent(instructions="You count."))
            session.on(
                "agent_state_changed", lambda ev: ev.new_state == "speaking" and first_text.set()
            )
            run = session.run(user_input=LONG)
            with anyio.fail_after(60):
                await first_text.wait()
            await session.interrupt()
            await run
        if engine == "local":
            await wait_until_free(local)
        else:
            assert await closed_at(proxy) is not None, "the cloud never saw the disconnect"
    [trace] = traces
    assert trace.engine == engine and trace.n_tokens < 400 and trace.finish_reason != "stop"


def test_the_example_agent_calls_its_tool_and_answers() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "livekit_agent.py")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    calls = [line for line in lines if line.startswith("tool call: get_weather(")]
    outputs = [line for line in lines if line.startswith("tool output: It is sunny")]
    assert calls and len(outputs) == len(calls)
    assert any(line.startswith("reply (local, ") for line in lines)
    figures = [line for line in lines if line.startswith("request ")]
    assert len(figures) == len(calls) + 1  # one LLM request per round of calls, one answer
    assert all("LiveKit ttft" in line and "trace ttft" in line for line in figures)
