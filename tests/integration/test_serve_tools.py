"""`hybridllm serve-model` answers tools (issue 26, part 3): Qwen2.5-Coder 0.5B behind the real
server,
read with the openai SDK. Non-streamed `message.tool_calls` with content None and finish reason
"tool_calls"; streamed `delta.tool_calls` then a "tool_calls" finish; a JSON-schema answer; a
tool loop; a bad tools field is a 400 in OpenAI's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer
from hybridllm.tools import check_answer, check_call, tool_spec
from tests.integration.servers import API_KEY
from tests.integration.test_tools_local import TOOLS

pytestmark = pytest.mark.integration

TIMER_CHOICE = {"type": "function", "function": {"name": "set_timer"}}
ASK = [{"role": "user", "content": "Set a timer for ten minutes."}]


@pytest.fixture(scope="module")
def server() -> Iterator[HybridServer]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    with HybridServer(path, alias="qwen", api_key=API_KEY, n_ctx=2048) as running:
        yield running


@pytest.fixture
def sdk(server: HybridServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_a_named_call_in_openai_s_shape(sdk: openai.OpenAI) -> None:
    spec = tool_spec(TOOLS, TIMER_CHOICE, None)
    assert spec is not None
    out = sdk.chat.completions.create(
        model="qwen",
        messages=ASK,
        tools=TOOLS,
        tool_choice=TIMER_CHOICE,
        temperature=0,  # type: ignore[arg-type]
    )
    assert isinstance(out, ChatCompletion)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].id.startswith("call_")
    fn = calls[0].function  # type: ignore[union-attr]
    args = check_call(spec, fn.name, fn.arguments, engine="cloud")
    assert fn.name == "set_timer" and isinstance(args["duration"], int)
    assert out.usage is not None and out.usage.completion_tokens > 0


def test_a_streamed_call_in_openai_s_shape(sdk: openai.OpenAI) -> None:
    spec = tool_spec(TOOLS, "required", None)
    assert spec is not None
    chunks = list(
        sdk.chat.completions.create(
            model="qwen",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert deltas and [d.index for d in deltas] == list(range(len(deltas)))
    for d in deltas:
        assert d.id is not None and d.id.startswith("call_") and d.type == "function"
        assert d.function is not None and d.function.name is not None
        check_call(spec, d.function.name, d.function.arguments or "", engine="cloud")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_and_a_json_schema_answer(sdk: openai.OpenAI) -> None:
    out = sdk.chat.completions.create(
        model="qwen",
        messages=ASK,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=40,  # type: ignore[arg-type]
    )
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
    schema = {
        "type": "object",
        "properties": {"minutes": {"type": "integer"}, "why": {"type": "string"}},
        "required": ["minutes", "why"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "timer", "schema": schema}}
    spec = tool_spec(None, None, fmt)
    assert spec is not None
    out = sdk.chat.completions.create(
        model="qwen",
        messages=ASK,
        response_format=fmt,
        temperature=0,
        max_tokens=80,  # type: ignore[arg-type]
    )
    assert out.choices[0].finish_reason == "stop"
    parsed = check_answer(spec, out.choices[0].message.content or "", engine="cloud")
    assert isinstance(parsed["minutes"], int)


def test_a_tool_loop_is_answered(sdk: openai.OpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "set_timer", "arguments": '{"duration": 10, "unit": "minutes"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
    ]
    out = sdk.chat.completions.create(
        model="qwen",
        messages=messages,
        tools=TOOLS,
        temperature=0,
        max_tokens=40,  # type: ignore[arg-type]
    )
    message = out.choices[0].message
    assert message.content or message.tool_calls
    assert "<tool_call>" not in (message.content or "")
    orphan = [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="qwen", messages=orphan, tools=TOOLS)  # type: ignore[arg-type]
    assert err.value.status_code == 400


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": "set_timer"}, "tools"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_bad_tools_field_is_a_400_in_openai_s_shape(
    sdk: openai.OpenAI, fields: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="qwen", messages=ASK, **fields)  # type: ignore[call-overload]
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param
    assert body["type"] == "invalid_request_error" and json.dumps(body)
