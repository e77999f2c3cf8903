"""What `hybridllm.integrations.livekit` hands across, checked on LiveKit's real types without a
model: the chat context as OpenAI messages, the agent's function tools as tool schemas, hybridllm
events as LiveKit chunks, each bad input refused by name, and what `chat()` is given reaching
the request a scripted engine gets or refused by name, never dropped (issue 42 item 5). The
streaming itself runs on real engines in tests/integration/test_livekit.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from livekit.agents import APIConnectionError, RunContext, function_tool, llm

from hybridllm import HybridClient, OpenAIEngine, Policy
from hybridllm.errors import EngineError, InvalidArgumentError
from hybridllm.events import Route, Token, ToolCall, Usage
from hybridllm.integrations.livekit import HybridLLM, chat_messages, to_chunk, tool_schemas
from hybridllm.testing import ScriptedEngine


@function_tool
async def get_weather(context: RunContext, city: str) -> str:
    """The weather now in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


def test_importing_the_package_loads_no_framework() -> None:
    code = "import sys, hybridllm.integrations; print('livekit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_tool_loop_becomes_openai_messages() -> None:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="system", content="Be brief.")
    ctx.add_message(role="user", content="Weather in Lisbon?")
    call = llm.FunctionCall(call_id="call_1", name="get_weather", arguments='{"city": "Lisbon"}')
    ctx.insert(call)
    ctx.insert(
        llm.FunctionCallOutput(call_id="call_1", name="get_weather", output="sunny", is_error=False)
    )
    messages = chat_messages(ctx)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Lisbon?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Lisbon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip


def test_an_image_is_refused_by_position() -> None:
    ctx = llm.ChatContext.empty()
    ctx.add_message(
        role="user", content=["What is this?", llm.ImageContent(image="https://x/y.png")]
    )
    with pytest.raises(InvalidArgumentError) as caught:
        chat_messages(ctx)
    assert caught.value.argument == "chat_ctx.items[0].content"


def test_a_function_tool_becomes_an_openai_tool_schema() -> None:
    [schema] = tool_schemas([get_weather])
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "get_weather" and function["description"].startswith("The weather")
    assert function["parameters"]["properties"]["city"]["type"] == "string"
    assert function["parameters"]["required"] == ["city"]


def test_events_become_chunks() -> None:
    text = to_chunk(Token(t=0.0, text="Hi", engine="local"), "req")
    assert text is not None and text.delta is not None and text.delta.content == "Hi"
    assert text.id == "req" and text.has_response()
    event = ToolCall(
        t=0.0, id="call_9", name="get_weather", arguments='{"city":"Oslo"}', engine="cloud"
    )
    call = to_chunk(event, "req")
    assert call is not None and call.delta is not None and call.has_response()
    [made] = call.delta.tool_calls
    assert (made.call_id, made.name, json.loads(made.arguments)) == (
        "call_9",
        "get_weather",
        {"city": "Oslo"},
    )
    usage = to_chunk(Usage(t=0.0, engine="local", prompt_tokens=7, completion_tokens=3), "req")
    assert usage is not None and usage.usage is not None and not usage.has_response()
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens, usage.usage.total_tokens) == (
        7,
        3,
        10,
    )
    assert to_chunk(Route(t=0.0, engine="local", reason="r"), "req") is None


@pytest.mark.anyio
async def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        HybridLLM(client="not a client")  # type: ignore[arg-type]
    assert caught.value.argument == "client"
    # never entered, never asked: the adapter's checks run before any request
    client = HybridClient(
        cloud=OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    )
    with pytest.raises(InvalidArgumentError) as caught:
        HybridLLM(client=client, show_drafts=True)
    assert caught.value.argument == "request.show_drafts"
    with pytest.raises(InvalidArgumentError) as caught:
        HybridLLM(client=client, colour="blue")  # type: ignore[call-arg]
    assert caught.value.argument == "colour"
    hybrid = HybridLLM(client=client)
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content="hi")
    with pytest.raises(InvalidArgumentError) as caught:
        hybrid.chat(chat_ctx=ctx, extra_kwargs={"policy": "chat"})
    assert caught.value.argument == "extra_kwargs.policy"


@pytest.mark.anyio
async def test_every_engine_failing_is_one_non_retryable_livekit_error() -> None:
    """A cloud on a closed loopback port (refused at once) and no other engine: hybridllm's
    failure reaches LiveKit as a non-retryable `APIConnectionError`, so neither LiveKit's retry
    loop nor a `FallbackAdapter` runs the hybrid plan again on its own."""
    dead = OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    policy = Policy(name="once", routing={"prefer": "cloud", "retries": 0})
    errors_seen: list[llm.LLMError] = []
    async with HybridClient(cloud=dead, policy=policy, router=None) as client:
        hybrid = HybridLLM(client=client)
        hybrid.on("error", errors_seen.append)
        ctx = llm.ChatContext.empty()
        ctx.add_message(role="user", content="hi")
        with pytest.raises(APIConnectionError) as caught:
            async with hybrid.chat(chat_ctx=ctx) as stream:
                async for _ in stream:
                    pass
    assert not caught.value.retryable and isinstance(caught.value.__cause__, EngineError)
    assert [e.recoverable for e in errors_seen] == [False]


def hello() -> llm.ChatContext:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content="hi")
    return ctx


@pytest.mark.anyio
async def test_a_tool_choice_without_tools_is_sent_as_given() -> None:
    """ "none" with no tools reaches the request (the client takes it: it asks for no call)."""
    local = ScriptedEngine("local", tokens=["Hi."])
    async with HybridClient(local=local, router=None) as client:
        async with HybridLLM(client=client).chat(chat_ctx=hello(), tool_choice="none") as stream:
            text = "".join([c.delta.content or "" async for c in stream if c.delta is not None])
    [request] = local.requests
    assert text == "Hi."
    assert request.tools is not None
    assert (request.tools.tools, request.tools.choice, request.tools.raw_choice) == (
        (),
        "none",
        "none",
    )


@pytest.mark.anyio
async def test_a_tool_choice_no_tool_can_answer_is_refused_as_the_client_refuses_it() -> None:
    """ "required" or a named tool with no tools: `chat()` raises the client's own error for
    it (the same argument, value and rule), and nothing is asked of the engine."""
    local = ScriptedEngine("local", tokens=["Hi."])
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with HybridClient(local=local, router=None) as client:
        hybrid = HybridLLM(client=client)
        for choice in ("required", named):
            with pytest.raises(InvalidArgumentError) as from_client:
                client.decide([{"role": "user", "content": "hi"}], tool_choice=choice)
            with pytest.raises(InvalidArgumentError) as from_adapter:
                hybrid.chat(chat_ctx=hello(), tool_choice=choice)  # type: ignore[arg-type]
            seen = (from_adapter.value.argument, from_adapter.value.value, from_adapter.value.rule)
            assert seen == ("tool_choice", choice, from_client.value.rule)
    assert local.requests == []


@pytest.mark.anyio
async def test_parallel_tool_calls_true_is_what_the_engines_do_and_false_is_refused() -> None:
    """True (an answer may carry several calls) runs the request with the tools; False has no
    field in a hybridllm request and is refused by name, not dropped."""
    local = ScriptedEngine("local", tokens=["Hi."])
    async with HybridClient(local=local, router=None) as client:
        hybrid = HybridLLM(client=client)
        with pytest.raises(InvalidArgumentError) as bad:
            hybrid.chat(chat_ctx=hello(), tools=[get_weather], parallel_tool_calls=False)
        assert (bad.value.argument, bad.value.value) == ("parallel_tool_calls", False)
        assert local.requests == []
        stream = hybrid.chat(chat_ctx=hello(), tools=[get_weather], parallel_tool_calls=True)
        async with stream:
            async for _ in stream:
                pass
    [request] = local.requests
    assert request.tools is not None and [t.name for t in request.tools.tools] == ["get_weather"]
