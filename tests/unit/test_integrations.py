"""The framework adapters' room (issue 30): importing it loads no framework, and the Pipecat
adapter's arguments and its message conversion (Pipecat's OpenAI messages -> hybridllm's); its
settings in the request a scripted engine gets, through Pipecat's own test pipeline
(`run_test`), each passed or refused by name, never dropped (issue 42 item 5). The adapter's
behaviour is tested in real pipelines in tests/integration/test_pipecat.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pipecat.frames.frames import ErrorFrame, LLMContextFrame, LLMUpdateSettingsFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.settings import LLMSettings
from pipecat.tests.utils import run_test

from hybridllm import HybridClient, LlamaOptions, OpenAIEngine, OpenAIOptions
from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.integrations.pipecat import HybridLLMService, chat_messages
from hybridllm.testing import ScriptedEngine

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


def asked(text: str) -> LLMContextFrame:
    return LLMContextFrame(context=LLMContext(messages=[{"role": "user", "content": text}]))


@pytest.mark.anyio
async def test_the_penalties_reach_the_request_given_or_updated() -> None:
    """Pipecat's `frequency_penalty` and `presence_penalty` (given, then updated by an
    `LLMUpdateSettingsFrame`) are the request's `OpenAIOptions` fields, over the `request`'s
    own, whose other fields and options are kept."""
    cloud = ScriptedEngine("cloud", tokens=["Hi."])
    mine = [OpenAIOptions(user="u1", presence_penalty=2.0), LlamaOptions(draft="off")]
    async with HybridClient(cloud=cloud, router=None) as client:
        llm = HybridLLMService(
            client=client,
            request={"options": mine},
            settings=LLMSettings(frequency_penalty=0.5, presence_penalty=-0.25),
        )
        update = LLMUpdateSettingsFrame(delta=LLMSettings(frequency_penalty=1.5))
        await run_test(llm, frames_to_send=[asked("Hi"), update, asked("Hi again")])
    first, second = cloud.requests
    assert first.option(OpenAIOptions) == OpenAIOptions(
        user="u1", frequency_penalty=0.5, presence_penalty=-0.25
    )
    assert second.option(OpenAIOptions) == OpenAIOptions(
        user="u1", frequency_penalty=1.5, presence_penalty=-0.25
    )
    assert first.option(LlamaOptions) == second.option(LlamaOptions) == LlamaOptions(draft="off")


@pytest.mark.anyio
async def test_top_k_has_no_field_in_a_request_and_is_refused_by_name() -> None:
    """Given to the service, `top_k` is refused at once; set by an update, the next answer is
    Pipecat's `ErrorFrame` carrying the refusal, and nothing is asked of the engine."""
    with pytest.raises(InvalidArgumentError) as bad:
        HybridLLMService(client=client(), settings=LLMSettings(top_k=40))
    assert (bad.value.argument, bad.value.value) == ("settings.top_k", 40)
    local = ScriptedEngine("local", tokens=["Hi."])
    async with HybridClient(local=local, router=None) as hybrid:
        llm = HybridLLMService(client=hybrid)
        update = LLMUpdateSettingsFrame(delta=LLMSettings(top_k=20))
        _down, up = await run_test(llm, frames_to_send=[update, asked("Hi")])
    assert local.requests == []
    [error] = [f for f in up if isinstance(f, ErrorFrame)]
    assert isinstance(error.exception, InvalidArgumentError)
    assert (error.exception.argument, error.exception.value) == ("settings.top_k", 20)
