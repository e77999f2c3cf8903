"""The gateway never drops a field, and text parts are text everywhere (issue 42, item 3): a
message's `name` reaches the client; an unknown message field, an unknown `stream_options` key,
and `max_tokens` beside a different `max_completion_tokens` are 400s naming the field; the SDK
takes OpenAI's list of text parts as the gateway does, and refuses an image part naming it."""

from __future__ import annotations

from typing import Any

import pytest

from hybridllm import HybridClient
from hybridllm.engines import validate
from hybridllm.errors import InvalidArgumentError
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.gateway.wire import chat_call
from hybridllm.server.schema import ApiError
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


def call(data: dict[str, Any]) -> Any:
    return chat_call(data, header_policy=None, policies=("chat",), limits=GatewayLimits())


def refused(data: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(data)
    return info.value


def test_a_messages_name_reaches_the_client() -> None:
    msgs = [{"role": "user", "content": "hi", "name": "ada"}]
    assert call({"model": "chat", "messages": msgs}).messages == [
        {"role": "user", "content": "hi", "name": "ada"}
    ]


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi", "mood": "x"}]}, "messages[0].mood"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"fast": True}},
            "stream_options.fast",
        ),
    ],
)
def test_an_unknown_inner_field_is_a_400_naming_it(data: dict[str, Any], param: str) -> None:
    err = refused({"model": "chat", **data})
    assert (err.status, err.code, err.param) == (400, "unsupported_parameter", param)


def test_null_inner_fields_count_as_absent() -> None:
    msgs = [
        {"role": "assistant", "content": "a", "refusal": None},
        {"role": "user", "content": "b"},
    ]
    opts = {"include_usage": True, "include_obfuscation": None}
    c = call({"model": "chat", "messages": msgs, "stream": True, "stream_options": opts})
    assert c.include_usage and len(c.messages) == 2


def test_max_tokens_beside_a_different_max_completion_tokens_is_a_400() -> None:
    base = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    err = refused({**base, "max_tokens": 10, "max_completion_tokens": 20})
    assert (err.status, err.code, err.param) == (400, "conflicting_parameters", "max_tokens")
    same = call({**base, "max_tokens": 20, "max_completion_tokens": 20})
    assert same.args["max_tokens"] == 20


def test_the_sdk_takes_text_parts_as_text() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    (msg,) = validate.messages([{"role": "user", "content": parts}])
    assert msg == {"role": "user", "content": "Hello, world"}


@pytest.mark.parametrize(
    "part", [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}, {"type": "text"}, "hi"]
)
def test_the_sdk_refuses_a_part_no_engine_takes_naming_it(part: object) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        validate.messages([{"role": "user", "content": [{"type": "text", "text": "a"}, part]}])
    assert caught.value.argument == "messages[0].content[1]" and caught.value.value == part


async def test_a_text_parts_prompt_streams_through_the_client() -> None:
    local = ScriptedEngine("local", tokens=["ok"])
    async with HybridClient(local=local, router=None) as client:
        answer = await client.complete(
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        )
    assert answer.text == "ok" and local.requests[0].messages[-1]["content"] == "hi"
