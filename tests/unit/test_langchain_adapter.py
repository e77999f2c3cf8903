"""`HybridChatModel`'s checks before any request (the real langchain-core; a scripted engine,
never started): every bad argument is a typed error naming it, and LangChain's tool_choice
words become OpenAI's, which the client then checks against the tools."""

from __future__ import annotations

import subprocess
import sys

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

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
        HybridChatModel(client=client, max_tokens=20)
    assert unknown.value.argument == "max_tokens"  # a request argument: model.bind(...)
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
