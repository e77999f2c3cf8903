"""`HybridChatModel`'s checks before any request (the real langchain-core; a scripted engine):
every bad argument is a typed error naming it, LangChain's tool_choice words become OpenAI's,
which the client then checks against the tools, and the request arguments given to the
constructor or bound reach the request the engine gets, whatever LangChain wraps around the
model (`with_structured_output`, `bind_tools`) and in either order (issue 42 item 5)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import Runnable
from pydantic import BaseModel

from hybridllm import HybridClient
from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.integrations.langchain import HybridChatModel, to_openai_messages
from hybridllm.testing import ScriptedEngine


@pytest.fixture
def client() -> HybridClient:
    return HybridClient(local=ScriptedEngine("local", tokens=["ok"]), router=None)


def test_bad_arguments_are_typed_errors_naming_them(client: HybridClient) -> None:
    with pytest.raises(InvalidArgumentError) as no_client:
        HybridChatModel(client="http://localhost")  # type: ignore[arg-type]
    assert no_client.value.argument == "client"
    with pytest.raises(PolicyError):
        HybridChatModel(client=client, policy="no-such-policy")
    with pytest.raises(InvalidArgumentError) as unknown:
        HybridChatModel(client=client, colour="blue")
    assert (unknown.value.argument, unknown.value.value) == ("colour", "blue")
    model = HybridChatModel(client=client, policy="chat")
    with pytest.raises(InvalidArgumentError) as method:
        model.with_structured_output({"title": "T", "type": "object"}, method="xml")  # type: ignore[arg-type]
    assert method.value.argument == "method"
    with pytest.raises(InvalidArgumentError) as choice:
        model.bind_tools([], tool_choice="")
    assert choice.value.argument == "tool_choice"


def test_tool_choice_words_become_openais(client: HybridClient) -> None:
    model = HybridChatModel(client=client)

    def get_weather(city: str) -> str:
        """The weather now in a city."""
        return city

    expected = {
        "any": "required",
        "required": "required",
        "auto": "auto",
        "none": "none",
        "get_weather": {"type": "function", "function": {"name": "get_weather"}},
    }
    for given, openai in expected.items():
        bound = model.bind_tools([get_weather], tool_choice=given)
        assert bound.kwargs["tool_choice"] == openai  # type: ignore[attr-defined]
    bound = model.bind_tools([get_weather], tool_choice=True)
    assert bound.kwargs["tool_choice"] == "required"  # type: ignore[attr-defined]
    assert bound.kwargs["tools"][0]["function"]["name"] == "get_weather"  # type: ignore[attr-defined]


def test_messages_become_openai_chat_dicts() -> None:
    call = {"name": "get_weather", "args": {"city": "Lisbon"}, "id": "call_1"}
    out = to_openai_messages(
        [
            SystemMessage("Be brief."),
            HumanMessage("Weather in Lisbon?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("Sunny", tool_call_id="call_1"),
        ]
    )
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool"]
    assert out[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Lisbon"}',
    }
    assert out[3]["tool_call_id"] == "call_1" and out[3]["content"] == "Sunny"


def test_the_integrations_package_imports_no_framework() -> None:
    """`import hybridllm.integrations` loads no framework: only its adapter modules do."""
    code = "import sys, hybridllm.integrations; print('langchain_core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class City(BaseModel):
    city: str


def get_weather(city: str) -> str:
    """The weather now in a city."""
    return city


Wrap = Callable[[HybridClient], Runnable[Any, Any]]
# max_tokens=60 given to the constructor, or bound before or after `with_structured_output`
# (with and without `include_raw`): LangChain hands a binding's `with_structured_output` to the
# model alone, and a chain's bound arguments to its first step only
STRUCTURED: dict[str, Wrap] = {
    "constructor": lambda c: HybridChatModel(client=c, max_tokens=60).with_structured_output(City),
    "bind-then-structured": lambda c: (
        HybridChatModel(client=c).bind(max_tokens=60).with_structured_output(City)
    ),
    "structured-then-bind": lambda c: (
        HybridChatModel(client=c).with_structured_output(City).bind(max_tokens=60)
    ),
    "bind-then-structured-raw": lambda c: (
        HybridChatModel(client=c).bind(max_tokens=60).with_structured_output(City, include_raw=True)
    ),
    "structured-raw-then-bind": lambda c: (
        HybridChatModel(client=c).with_structured_output(City, include_raw=True).bind(max_tokens=60)
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("wrap", STRUCTURED.values(), ids=STRUCTURED.keys())
async def test_max_tokens_reaches_the_request_under_structured_output(wrap: Wrap) -> None:
    """The engine's request asks for 60 tokens and carries the response format, whether the
    answer is invoked or streamed."""
    engine = ScriptedEngine("local", tokens=['{"city": "Oslo"}'])
    async with HybridClient(local=engine, router=None) as client:
        runnable = wrap(client)
        answer = await runnable.ainvoke("Capital of Norway?")
        parsed = answer["parsed"] if isinstance(answer, dict) else answer
        assert parsed == City(city="Oslo")
        request = engine.requests[-1]
        assert request.max_tokens == 60
        assert request.tools is not None and request.tools.response_format is not None
        async for _ in runnable.astream("Capital of Norway?"):
            pass
        assert len(engine.requests) == 2 and engine.requests[-1].max_tokens == 60


@pytest.mark.anyio
async def test_max_tokens_bound_before_the_tools_reaches_the_request() -> None:
    engine = ScriptedEngine("local", tokens=["Sunny."])
    async with HybridClient(local=engine, router=None) as client:
        model = HybridChatModel(client=client).bind(max_tokens=60)
        await model.bind_tools([get_weather], tool_choice="none").ainvoke("Weather in Oslo?")
    [request] = engine.requests
    assert request.max_tokens == 60
    assert request.tools is not None and [t.name for t in request.tools.tools] == ["get_weather"]


def test_a_bad_value_given_to_the_constructor_is_refused_as_the_client_refuses_it(
    client: HybridClient,
) -> None:
    """The constructor takes the request arguments and checks their values now: a bad one is
    the client's own error for it (the same argument, value and rule), not a refusal of the
    name."""
    with pytest.raises(InvalidArgumentError) as from_client:
        client.decide([{"role": "user", "content": "hi"}], max_tokens=0)
    for bad in ({"max_tokens": 0}, {"request": {"max_tokens": 0}}):
        with pytest.raises(InvalidArgumentError) as from_model:
            HybridChatModel(client=client, **bad)
        seen = (from_model.value.argument, from_model.value.value, from_model.value.rule)
        assert seen == ("max_tokens", 0, from_client.value.rule)
    model = HybridChatModel(client=client, max_tokens=60, temperature=0.0)
    assert model.request == {"max_tokens": 60, "temperature": 0.0}
