"""`HybridChatModel` through the real langchain-core on the real local engine (Qwen2.5-Coder
0.5B, whose template renders tools) and the stand-in cloud (`hybridllm serve-model`, SmolLM2):
streamed and whole answers with the route and usage in LangChain's fields, LangChain's own
callbacks, a tool call and an agent's tool loop, a structured-output chain, the sync forms,
and a cancelled `astream` stopping the engine. Answers are short (max_tokens bound)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from pydantic import BaseModel

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.integrations.langchain import HybridChatModel
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer
from tests.integration.recorded import Recorded
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COUNT = "Count from 1 to 300, separated by commas."


@tool
def get_weather(city: str) -> str:
    """The weather now in a city."""
    return f"Sunny and 24 C in {city}."


class City(BaseModel):
    """A city and the country it is in."""

    name: str
    country: str


@pytest.fixture(scope="module")
def local() -> LlamaCppEngine:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    return LlamaCppEngine(str(path), n_threads=1, n_ctx=2048, warm_up=False)


@pytest.fixture
async def client(local: LlamaCppEngine, cloud_server: HybridServer) -> AsyncIterator[HybridClient]:
    cloud = OpenAIEngine(base_url=f"{cloud_server.url}/v1", api_key=API_KEY, model=ALIAS)
    async with HybridClient(local=local, cloud=cloud, router=None, telemetry=Recorded()) as c:
        yield c


async def until(cond: Callable[[], bool], limit_s: float = 30.0) -> None:
    """Wait (a liveness bound, not a timing claim) until `cond()` holds."""
    with anyio.fail_after(limit_s):
        while not cond():  # noqa: ASYNC110 - an engine's flag: no event to wait on
            await anyio.sleep(0.005)


class FirstToken(AsyncCallbackHandler):
    """LangChain's own view: the chunks its callbacks saw."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


async def test_astream_carries_route_usage_and_callbacks(client: HybridClient) -> None:
    model = HybridChatModel(client=client).bind(engine="local", max_tokens=16)
    seen = FirstToken()
    chunks = [c async for c in model.astream("Say hello in five words.", {"callbacks": [seen]})]
    whole = chunks[0]
    for c in chunks[1:]:
        whole = whole + c
    assert isinstance(whole, AIMessageChunk) and isinstance(whole.content, str)
    meta = whole.response_metadata
    assert meta["engine"] == "local" and meta["plan"] == "single" and meta["reason"]
    trace = meta["trace"]
    assert whole.content == "".join(t for t in seen.tokens)
    assert meta["ttft_ms"] == trace["ttft_ms"] and meta["ttft_ms"] > 0
    assert whole.usage_metadata is not None
    assert whole.usage_metadata["output_tokens"] == trace["usage"]["completion_tokens"]
    assert whole.usage_metadata["input_tokens"] == trace["usage"]["prompt_tokens"] > 0


async def test_ainvoke_on_the_cloud_names_it(client: HybridClient) -> None:
    model = HybridChatModel(client=client).bind(engine="cloud", max_tokens=8)
    answer = await model.ainvoke([HumanMessage("Say hi.")])
    assert answer.content and answer.response_metadata["engine"] == "cloud"
    assert answer.response_metadata["model_name"] == ALIAS
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0


async def test_a_tool_loop_as_an_agent_runs_it(client: HybridClient) -> None:
    """A forced call, run by LangChain's tool, its result sent back; the answer is text."""
    model = HybridChatModel(client=client).bind(engine="local", max_tokens=60)
    history: list[BaseMessage] = [HumanMessage("What's the weather in Lisbon?")]
    asked = await model.bind_tools([get_weather], tool_choice="any").ainvoke(history)
    assert len(asked.tool_calls) == 1 and asked.tool_calls[0]["name"] == "get_weather"
    assert isinstance(asked.tool_calls[0]["args"]["city"], str)
    assert asked.response_metadata["finish_reason"] == "tool_calls"
    result: ToolMessage = await get_weather.ainvoke(asked.tool_calls[0])
    history += [asked, result]
    answer = await model.bind_tools([get_weather], tool_choice="none").ainvoke(history)
    assert answer.content and not answer.tool_calls


async def test_streamed_tool_call_arrives_whole(client: HybridClient) -> None:
    model = HybridChatModel(client=client).bind(engine="local", max_tokens=60)
    bound = model.bind_tools([get_weather], tool_choice="get_weather")
    parts = [c async for c in bound.astream("What's the weather in Paris?")]
    calls = [c for c in parts if c.tool_call_chunks]
    assert len(calls) == 1  # complete and checked: never split across chunks
    assert calls[0].tool_calls[0]["name"] == "get_weather"
    assert isinstance(calls[0].tool_calls[0]["args"]["city"], str)


async def test_a_structured_output_chain(client: HybridClient) -> None:
    prompt = ChatPromptTemplate.from_messages([("user", "Name the capital of {country}.")])
    chain = prompt | HybridChatModel(client=client).with_structured_output(City)
    city = await chain.ainvoke({"country": "France"}, {"configurable": {}})
    assert isinstance(city, City) and city.name and city.country
    raw = HybridChatModel(client=client).with_structured_output(City, include_raw=True)
    out = await raw.ainvoke("Name the capital of Italy.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], City)
    assert out["raw"].response_metadata["engine"] in ("local", "cloud")


async def test_cancelled_astream_stops_the_engine(
    client: HybridClient, local: LlamaCppEngine
) -> None:
    """Cancelling the task consuming an astream returns with the local engine free again;
    closing the generator early stops it too, once Python finalises LangChain's inner
    generator (LangChain's astream does not close it: asyncio does, on its next turn). Each
    request's trace says its local attempt was cancelled, its answer unfinished."""
    recorded = client.telemetry
    assert isinstance(recorded, Recorded)
    model = HybridChatModel(client=client).bind(engine="local", max_tokens=300)
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in model.astream(COUNT):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not local.busy

    chunks = model.astream(COUNT)
    first = await anext(chunks)
    assert first.content and local.busy
    await chunks.aclose()
    await until(lambda: len(recorded.traces) == 2 and not local.busy)
    for trace in recorded.traces:
        assert trace.finish_reason == "cancelled" and trace.attempts[-1].outcome == "cancelled"
        assert trace.n_tokens < 300


@pytest.fixture(scope="module")
def sync_client(model_path: Path) -> Iterator[HybridClient]:
    """A client used only through the blocking wrappers (its own event loop thread)."""
    engine = LlamaCppEngine(str(model_path), n_threads=1, n_ctx=1024, warm_up=False)
    with HybridClient(local=engine, router=None) as c:
        yield c


def test_sync_invoke_and_stream(sync_client: HybridClient) -> None:
    model = HybridChatModel(client=sync_client).bind(max_tokens=12)
    answer = model.invoke("Say hello.")
    assert answer.content and answer.response_metadata["engine"] == "local"
    chunks = list(model.stream("Say hello."))
    assert chunks[-1].response_metadata["engine"] == "local"
    assert "".join(str(c.content) for c in chunks)
    stopped = model.bind(max_tokens=200).stream(COUNT)
    assert next(stopped).content
    stopped.close()  # leaving early stops the engine through the portal
    assert not sync_client.local.busy  # type: ignore[union-attr]


def test_the_chain_example_runs() -> None:
    """examples/langchain_chain.py: each line a parsed `Capital` and its route."""
    example = Path(__file__).resolve().parents[2] / "examples" / "langchain_chain.py"
    proc = subprocess.run(
        [sys.executable, str(example), "--threads", "1", "France"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parsed, route = proc.stdout.splitlines()[:2]
    assert parsed.startswith("Capital(country=") and "capital=" in parsed
    assert route.split()[0] == "engine=local"
