"""Tool calls through `HybridClient` over the real engines (issue 26): the cloud engine
(`OpenAIEngine`) against the real stand-in server answering tools, and the hybrid rules with the
real local engine beside it. Qwen2.5-Coder 0.5B on both sides (the smallest model whose template
renders tools)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, ToolCall
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer
from hybridllm.tools import check_call, tool_spec
from tests.integration.servers import API_KEY
from tests.integration.test_tools_local import TOOLS

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

MODEL = "qwen2.5-coder-0.5b-instruct"
TIMER_CHOICE = {"type": "function", "function": {"name": "set_timer"}}
ASK = [{"role": "user", "content": "Set a timer for ten minutes."}]
CLOUD_ONLY = Policy(name="cloud-tools", routing={"prefer": "cloud", "retries": 0})


@pytest.fixture(scope="module")
def server() -> Iterator[HybridServer]:
    with HybridServer(resolve_model(MODEL, pull=True), alias="qwen", api_key=API_KEY) as running:
        yield running


def cloud(server: HybridServer) -> OpenAIEngine:
    return OpenAIEngine(base_url=server.url + "/v1", api_key=API_KEY, model="qwen")


def local() -> LlamaCppEngine:
    return LlamaCppEngine(resolve_model(MODEL), n_ctx=2048, warm_up=False, use_tuning=False)


async def test_the_cloud_engine_delivers_a_checked_call_from_the_real_server(
    server: HybridServer,
) -> None:
    spec = tool_spec(TOOLS, TIMER_CHOICE, None)
    async with HybridClient(cloud=cloud(server), policy=CLOUD_ONLY, router=None) as client:
        async with client.stream(ASK, tools=TOOLS, tool_choice=TIMER_CHOICE, max_tokens=80) as s:
            events = [e async for e in s.events()]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert len(calls) == 1 and calls[0].engine == "cloud" and calls[0].name == "set_timer"
    assert spec is not None and check_call(spec, calls[0].name, calls[0].arguments, engine="x")
    assert calls[0].confidence is None  # a cloud call carries no confidence of its own
    assert s.trace.finish_reason == "tool_calls" and s.trace.ttft_ms is not None


async def test_a_tool_loop_goes_to_the_cloud_whole_and_is_answered(server: HybridServer) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "What's the weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"celsius": 21})},
    ]
    async with HybridClient(cloud=cloud(server), policy=CLOUD_ONLY, router=None) as client:
        done = await client.complete(messages, tools=TOOLS, tool_choice="none", max_tokens=40)
    assert done.tool_calls == () and done.text.strip() and done.finish_reason in ("stop", "length")
    assert done.trace.engine == "cloud"


async def test_an_unsure_local_call_is_answered_by_the_cloud(server: HybridServer) -> None:
    """Every local call is below a bound of 1.0, so the real cloud answers each one; the
    local call is never delivered."""
    policy = Policy(name="unsure", routing={"prefer": "local"}, tools={"min_call_confidence": 1.0})
    async with HybridClient(
        local=local(), cloud=cloud(server), policy=policy, router=None
    ) as client:
        async with client.stream(ASK, tools=TOOLS, tool_choice=TIMER_CHOICE, max_tokens=80) as s:
            events = [e async for e in s.events()]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.engine for c in calls] == ["cloud"]
    fallback = next(e for e in events if isinstance(e, Fallback))
    assert fallback.from_engine == "local" and "unsure" in fallback.reason
    assert s.trace.engine == "cloud"
