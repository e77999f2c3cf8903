"""Tool calls and JSON answers on the real local engine (Qwen2.5-Coder 0.5B, whose template
renders tools): a forced call is always schema-valid and never text, "none" answers in text, a
JSON-schema answer validates, a tool loop renders as the template expects and is answered."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from hybridllm.engines.base import GenerationRequest, Message
from hybridllm.engines.llamacpp import LlamaCppEngine
from hybridllm.events import Called, CallOpened, Delta, Finish
from hybridllm.local.resolve import resolve_model
from hybridllm.tools import check_answer, check_call, tool_spec

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

TIMER = {
    "type": "object",
    "properties": {
        "duration": {"type": "integer", "description": "how long"},
        "unit": {"type": "string", "enum": ["seconds", "minutes", "hours"]},
        "label": {"type": "string"},
    },
    "required": ["duration", "unit"],
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "boolean"}},
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "set_timer", "description": "Start a timer", "parameters": TIMER},
    },
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
]
ASKS = [
    "Set a timer for five minutes for the eggs.",
    "Remind me in 2 hours.",
    "What's the weather in Lisbon?",
    "Tell me a joke.",
]


def engine() -> LlamaCppEngine:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    return LlamaCppEngine(path, n_ctx=2048, warm_up=False, use_tuning=False)


async def run(
    local: LlamaCppEngine, messages: Sequence[Message], spec: Any, **kw: Any
) -> tuple[str, list[Called], Finish]:
    request = GenerationRequest(messages=messages, tools=spec, **{"max_tokens": 80, **kw})
    text, calls, finish = "", [], None
    async for chunk in local.stream(request):
        if isinstance(chunk, Delta):
            text += chunk.text
        elif isinstance(chunk, Called):
            calls.append(chunk)
        elif isinstance(chunk, Finish):
            finish = chunk
    assert finish is not None
    return text, calls, finish


async def test_a_required_call_is_schema_valid_and_never_text() -> None:
    local = engine()
    required = tool_spec(TOOLS, "required", None)
    named = tool_spec(TOOLS, {"type": "function", "function": {"name": "set_timer"}}, None)
    assert required is not None and named is not None
    try:
        for i, ask in enumerate(ASKS):
            for spec, temperature in ((required, 0.0), (named, 1.0)):
                messages = [{"role": "user", "content": ask}]
                text, calls, finish = await run(
                    local, messages, spec, temperature=temperature, seed=i
                )
                assert text == "" and "<tool_call>" not in text
                assert calls and finish.reason == "tool_calls"
                for call in calls:  # check_call: types, required fields and enums
                    args = check_call(spec, call.name, call.arguments, engine="local")
                    assert call.id.startswith("call_")
                    if call.name == "set_timer":
                        assert isinstance(args["duration"], int)
                        assert args["unit"] in ("seconds", "minutes", "hours")
                    else:
                        assert isinstance(args["city"], str)
                if spec is named:
                    assert {c.name for c in calls} == {"set_timer"}
    finally:
        await local.aclose()


async def test_each_call_is_named_before_it_comes_whole() -> None:
    """The real engine says a call's function as soon as its JSON has written the name (a
    `CallOpened` mark), before the call's arguments and the whole call (`Called`)."""
    local = engine()
    spec = tool_spec(TOOLS, "required", None)
    request = GenerationRequest(
        messages=[{"role": "user", "content": ASKS[0]}], tools=spec, max_tokens=80
    )
    seen: list[tuple[str, str, float]] = []
    try:
        async for chunk in local.stream(request):
            if isinstance(chunk, CallOpened):
                seen.append(("opened", chunk.call_name, chunk.t))
            elif isinstance(chunk, Called):
                seen.append(("called", chunk.name, chunk.t))
    finally:
        await local.aclose()
    kinds = [k for k, _, _ in seen]
    assert kinds[:2] == ["opened", "called"] and kinds.count("opened") == kinds.count("called")
    (_, opened, t_opened), (_, name, t_called) = seen[0], seen[1]
    assert opened == name and t_opened < t_called  # the arguments came after the name


async def test_tool_choice_none_answers_in_text() -> None:
    local = engine()
    spec = tool_spec(TOOLS, "none", None)
    try:
        messages = [{"role": "user", "content": "Set a timer for five minutes."}]
        text, calls, finish = await run(local, messages, spec, temperature=0.0)
        assert calls == [] and finish.reason in ("stop", "length")
        assert text.strip() and "<tool_call>" not in text
        session = local._session
        assert session is not None
        prepared = session.prepare(GenerationRequest(messages=messages, tools=spec))
        trigger = session.tokenize("<tool_call>")[0]
        assert prepared.logit_bias == {trigger: -100.0}  # the tools shown, the call banned
        assert "set_timer" in session.render(messages, [t.raw for t in spec.tools])
    finally:
        await local.aclose()


async def test_a_json_schema_answer_parses_and_validates() -> None:
    local = engine()
    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "role": {"type": "string", "enum": ["admin", "user"]},
        },
        "required": ["name", "age", "role"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
    spec = tool_spec(None, None, fmt)
    any_object = tool_spec(None, None, {"type": "json_object"})
    assert spec is not None and any_object is not None
    try:
        for i, temperature in enumerate((0.0, 1.0)):
            messages = [{"role": "user", "content": "Describe one person."}]
            text, calls, finish = await run(local, messages, spec, temperature=temperature, seed=i)
            parsed = check_answer(spec, text, engine="local")
            assert calls == [] and finish.reason == "stop"
            assert isinstance(parsed["age"], int) and parsed["role"] in ("admin", "user")
            text, _, _ = await run(local, messages, any_object, temperature=temperature, seed=i)
            assert isinstance(check_answer(any_object, text, engine="local"), dict)
    finally:
        await local.aclose()


async def test_a_tool_loop_renders_as_the_template_expects_and_is_answered() -> None:
    local = engine()
    spec = tool_spec(TOOLS, "auto", None)
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Lisbon"}'},
    }
    messages = [
        {"role": "user", "content": "What's the weather in Lisbon?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": '{"sky": "sunny", "c": 24}'},
    ]
    try:
        await local.start()
        session = local._session
        assert session is not None
        prompt = session.render(messages, [t.raw for t in spec.tools])
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n' in prompt
        assert '<tool_response>\n{"sky": "sunny", "c": 24}\n</tool_response>' in prompt
        text, calls, finish = await run(local, messages, spec, temperature=0.0)
        assert text.strip() or calls  # an answer: text, or a further call that is valid
        for c in calls:
            check_call(spec, c.name, c.arguments, engine="local")
        assert finish.reason == ("tool_calls" if calls else "stop")
        assert "<tool_call>" not in text
    finally:
        await local.aclose()


async def test_auto_reads_a_call_written_as_json_as_a_call_with_its_confidence() -> None:
    """Under tool_choice "auto" the coder model writes its call as a fenced JSON block, not in
    its template's <tool_call> markup: the engine reads that opening as a call, makes it under
    the call grammar, and says how sure the model was. Nothing of the JSON is text."""
    local = engine()
    await local.start()
    try:
        spec = tool_spec(TOOLS, "auto", None)
        ask = [{"role": "user", "content": ASKS[0]}]
        text, calls, finish = await run(local, ask, spec, temperature=0.0)
    finally:
        await local.aclose()
    assert len(calls) >= 1 and finish.reason == "tool_calls"
    assert "```" not in text and "{" not in text
    for call in calls:
        check_call(spec, call.name, call.arguments, engine="local")  # type: ignore[arg-type]
        assert call.confidence is not None and 0.0 < call.confidence <= 1.0


async def test_a_call_to_a_function_not_offered_becomes_a_text_answer() -> None:
    """Asked something no offered tool fits, the coder model writes a call to a function of
    its own; the engine answers in text rather than forcing that call onto an offered tool."""
    local = engine()
    await local.start()
    try:
        spec = tool_spec(TOOLS, "auto", None)
        ask = [
            {"role": "user", "content": "What is the area of a triangle of base 10 and height 5?"}
        ]
        text, calls, finish = await run(local, ask, spec, temperature=0.0, max_tokens=60)
    finally:
        await local.aclose()
    assert calls == [] and finish.reason in ("stop", "length") and text.strip()


async def test_a_second_call_after_the_first_is_delivered_too() -> None:
    """Parallel calls: after a call the engine lets the model open another (Qwen's template
    writes several `<tool_call>` blocks one after the other), each checked and delivered."""
    local = engine()
    await local.start()
    em_force = {
        "type": "object",
        "properties": {
            "b_field": {"type": "integer", "description": "magnetic field in Tesla"},
            "area": {"type": "integer", "description": "area in square meters"},
            "d_time": {"type": "integer", "description": "change in time in seconds"},
        },
        "required": ["b_field", "area", "d_time"],
    }
    tool = {
        "type": "function",
        "function": {
            "name": "calculate_em_force",
            "description": "Calculate the induced electromagnetic force.",
            "parameters": em_force,
        },
    }
    ask = (
        "Calculate the induced electromagnetic force for a magnetic field of 5 Tesla, area of "
        "2 square meters and change in time of 4 seconds, then repeat with a change in time "
        "of 10 seconds."
    )
    try:
        spec = tool_spec([tool], "auto", None)
        messages = [{"role": "user", "content": ask}]
        text, calls, finish = await run(local, messages, spec, temperature=0.0, max_tokens=160)
    finally:
        await local.aclose()
    assert finish.reason == "tool_calls" and "<tool_call>" not in text
    assert [c.name for c in calls] == ["calculate_em_force"] * 2
    times = sorted(json.loads(c.arguments)["d_time"] for c in calls)
    assert times == [4, 10]
    for call in calls:
        check_call(spec, call.name, call.arguments, engine="local")  # type: ignore[arg-type]
