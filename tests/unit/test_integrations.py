"""The framework adapters' room (issue 30): importing it loads no framework, and the Pipecat
adapter's arguments and its message conversion (Pipecat's OpenAI messages -> hybridllm's). The
adapter's behaviour is tested in real pipelines in tests/integration/test_pipecat.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridllm import HybridClient, OpenAIEngine
from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.integrations.pipecat import HybridLLMService, chat_messages

FRAMEWORKS = ("pipecat", "livekit", "langchain_core")


def test_importing_the_room_loads_no_framework() -> None:
    code = (
        "import sys, hybridllm.integrations\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_text_parts_become_the_messages_text_and_tool_turns_pass_whole() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi, "}, {"type": "text", "text": "you"}],
        },
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    out = chat_messages(messages)
    assert out[0] == {"role": "user", "content": "Hi, you"}
    assert out[1:] == messages[1:]


def test_a_part_other_than_text_is_refused_naming_the_message() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": [image]}]
    with pytest.raises(InvalidArgumentError) as bad:
        chat_messages(messages)
    assert bad.value.argument == "context.messages[1].content"


def client() -> HybridClient:
    """A client that is never opened: nothing is sent."""
    cloud = OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key="sk-x", model="m")
    return HybridClient(cloud=cloud, router=None)


def test_the_services_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        HybridLLMService(client="client")  # type: ignore[arg-type]
    assert bad.value.argument == "client"
    with pytest.raises(InvalidArgumentError) as bad:
        HybridLLMService(client=client(), request={"tool_choice": "auto"})
    assert bad.value.argument == "request['tool_choice']"
    with pytest.raises(PolicyError, match="nope"):
        HybridLLMService(client=client(), policy="nope")
