"""The pure parts of local tool calls (`engines.llama.toolcalls`): the call schema and grammar
built from the tools, the plan per tool choice, the call markup parsed, messages for templates."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from hybridllm.engines.llama import toolcalls
from hybridllm.engines.llama.toolcalls import (
    CALL_CLOSE,
    CALL_OPEN,
    answer_gbnf,
    call_gbnf,
    call_schema,
    parse_call,
    template_messages,
    tool_plan,
)
from hybridllm.errors import InvalidArgumentError
from hybridllm.tools import tool_spec

TIMER = {
    "type": "object",
    "properties": {
        "minutes": {"type": "integer"},
        "unit": {"type": "string", "enum": ["min", "s"]},
        "label": {"type": "string"},
    },
    "required": ["minutes", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "set_timer", "parameters": TIMER}},
    {"type": "function", "function": {"name": "get_time"}},
]
TRIGGER, CLOSE = 7, [1, 2, 3]


def plan(tools: Any = TOOLS, choice: Any = None, fmt: Any = None, *, renders: bool = True) -> Any:
    return tool_plan(
        tool_spec(tools, choice, fmt),
        renders_tools=renders,
        token_of=lambda text: TRIGGER if text == CALL_OPEN else None,
        tokenize=lambda text: CLOSE if text == CALL_CLOSE else [],
    )


def test_call_schema_is_a_one_of_over_the_tools_name_then_arguments() -> None:
    spec = tool_spec(TOOLS, None, None)
    assert spec is not None
    schema = call_schema(spec.tools)
    first, second = schema["oneOf"]
    assert list(first["properties"]) == ["name", "arguments"]
    assert first["properties"]["name"] == {"const": "set_timer"}
    assert first["properties"]["arguments"] == TIMER
    assert first["required"] == ["name", "arguments"] and first["additionalProperties"] is False
    assert second["properties"]["arguments"] == {"type": "object", "properties": {}}
    assert call_schema(spec.tools[:1]) == first  # one tool: no oneOf


def test_call_grammar_names_only_the_callable_tools_and_their_enum_values() -> None:
    spec = tool_spec(TOOLS, {"type": "function", "function": {"name": "set_timer"}}, None)
    assert spec is not None
    grammar = call_gbnf(spec.callable_tools)
    root = grammar.splitlines()[0]
    assert root == 'root ::= "\\n"? hybridllm-body'
    assert '"\\"set_timer\\""' in grammar and "get_time" not in grammar
    assert '"\\"min\\""' in grammar and '"\\"s\\""' in grammar
    assert sum(line.startswith("root ::=") for line in grammar.splitlines()) == 1


def test_answer_grammar_of_a_schema_and_of_any_object() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": TIMER}}
    spec = tool_spec(None, None, fmt)
    assert spec is not None and spec.response_format is not None
    grammar = answer_gbnf(spec.response_format)
    assert grammar.startswith("root ::= hybridllm-body\n") and '"\\"minutes\\""' in grammar
    any_object = tool_spec(None, None, {"type": "json_object"})
    assert any_object is not None and any_object.response_format is not None
    assert "object ::=" in answer_gbnf(any_object.response_format)


def test_a_schema_the_converter_cannot_take_is_an_error_naming_the_argument() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    with pytest.raises(InvalidArgumentError) as err:
        plan(None, None, fmt)
    assert err.value.argument == "response_format.json_schema.schema"
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    with pytest.raises(InvalidArgumentError) as err:
        plan(tools, "required")
    assert err.value.argument == "tools"


def test_a_parameter_that_only_describes_itself_takes_any_value() -> None:
    """`{"description": ...}` is any value in JSON Schema (BFCL's "any" parameters); llama.cpp's
    converter refuses it, so the grammar spells it as a union of every type. A property named
    like an annotation keeps its own schema."""
    described = {"description": "The training data."}
    schema = {
        "type": "object",
        "properties": {"data": described, "description": {"type": "string"}},
        "items": described,
        "anyOf": [described],
    }
    spelt = toolcalls._bare_as_any(schema)
    union = {"type": ["string", "number", "boolean", "object", "array", "null"]}
    assert spelt["properties"] == {"data": union, "description": {"type": "string"}}
    assert spelt["items"] == union and spelt["anyOf"] == [union]
    tools = [{"type": "function", "function": {"name": "train", "parameters": schema}}]
    grammar = plan(tools, "required").call_grammar
    assert grammar is not None and "null" in grammar  # it builds, null among the values


def test_the_plan_per_tool_choice() -> None:
    auto = plan()
    assert auto.trigger == TRIGGER and not auto.start_in_call and auto.banned == ()
    assert auto.close == tuple(CLOSE) and auto.answer_grammar is None
    assert "get_time" in auto.call_grammar
    required = plan(choice="required")
    assert required.start_in_call and required.call_grammar == auto.call_grammar
    named = plan(choice={"type": "function", "function": {"name": "get_time"}})
    assert named.start_in_call and "set_timer" not in named.call_grammar
    none = plan(choice="none")
    assert none.trigger is None and none.call_grammar is None and none.banned == (TRIGGER,)
    only_json = plan(None, None, {"type": "json_object"})
    assert only_json.trigger is None and only_json.answer_grammar is not None
    assert plan(None, "none", None) is None  # nothing to constrain


def test_a_model_that_cannot_call_is_refused_on_tools() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        plan(renders=False)
    assert err.value.argument == "tools"
    no_token = tool_spec(TOOLS, None, None)
    with pytest.raises(InvalidArgumentError):
        tool_plan(no_token, renders_tools=True, token_of=lambda _t: None, tokenize=lambda _t: [])


def test_parse_call_gives_compact_arguments_and_a_fresh_id() -> None:
    one = parse_call('\n{"name": "set_timer", "arguments": {"minutes": 5, "unit": "min"}} ')
    assert one.name == "set_timer" and one.arguments == '{"minutes":5,"unit":"min"}'
    assert one.id.startswith("call_") and len(one.id) == 29
    assert parse_call('{"name": "set_timer", "arguments": {}}').id != one.id
    texty = parse_call('{"name": "f", "arguments": "{\\"a\\": \\"é\\"}"}')
    assert texty.arguments == '{"a":"é"}'
    assert parse_call('{"name": "get_time"}').arguments == "{}"
    for bad in ('{"name": 3, "arguments": {}}', '{"name": "f", "arguments": [1]}', "[]", "{"):
        with pytest.raises(ValueError):
            parse_call(bad)


def test_template_messages_parse_call_arguments_and_keep_the_rest() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    bad = {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call, bad]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    out = template_messages(messages)
    assert out[0] == messages[0] and out[2] == messages[2]
    first, second = out[1]["tool_calls"]
    assert first == {**call, "function": {"name": "f", "arguments": {"a": 1}}}
    assert second == bad  # text that does not parse stays text
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("", None),
        ("\n", None),
        ("`", None),
        ("```", None),
        ("```js", None),
        ("```json\n", None),
        ("```json\n{", True),
        ("```\n{", True),
        ("  {", True),
        ("```python", False),
        ("Sure", False),
        ("[1", False),
    ],
)
def test_a_json_opening_is_told_from_text_as_soon_as_it_can_be(
    text: str, verdict: bool | None
) -> None:
    assert toolcalls.json_opening(text) is verdict


def test_confidence_is_the_geometric_mean_of_the_token_probabilities() -> None:
    assert toolcalls.confidence(()) is None
    assert toolcalls.confidence((math.log(0.5), math.log(0.5))) == pytest.approx(0.5)
    assert toolcalls.confidence((0.0, math.log(0.25))) == pytest.approx(0.5)


def test_a_calls_confidence_is_its_weaker_part_the_markup_before_the_name_left_out() -> None:
    lp = math.log
    # the tokens of `{"name": "set_timer", "arguments": {"minutes": 5}}`, as a model splits them
    pieces = ['{"', "name", '":', ' "', "set", "_timer", '",', ' "', "arguments", '":', " {",
              '"minutes', '":', " ", "5", "}}"]  # fmt: skip
    sure = [0.0] * len(pieces)
    # the forced opening `{"` at 0.01 leaves the figure alone
    assert toolcalls.call_confidence(pieces, [lp(0.01), *sure[1:]]) == pytest.approx(1.0)
    # an unsure value lowers the arguments' part: each part starts after the token that
    # closes its key's quote
    unsure_value = list(sure)
    unsure_value[14] = lp(0.25)
    value_part = 0.25 ** (1 / 6)  # ` {` `"minutes` `":` ` ` `5` `}}`
    assert toolcalls.call_confidence(pieces, unsure_value) == pytest.approx(value_part)
    # an unsure name lowers the name's part, which is then the weaker one
    unsure_name = list(sure)
    unsure_name[4] = lp(0.01)
    name_part = 0.01 ** (1 / 7)  # ` "` `set` `_timer` `",` ` "` `arguments` `":`
    assert toolcalls.call_confidence(pieces, unsure_name) == pytest.approx(name_part)
    # no name to tell the parts by: the geometric mean of all the tokens
    assert toolcalls.call_confidence(["{}"], [lp(0.5)]) == pytest.approx(0.5)
    assert toolcalls.call_confidence([], []) is None


def test_a_named_functions_call_is_opened_for_the_model_and_its_arguments_alone_count() -> None:
    lp = math.log
    tools = [{"type": "function", "function": {"name": "set_timer"}}]

    def plan_of(choice: Any) -> toolcalls.ToolPlan | None:
        spec = tool_spec(tools, choice, None)
        return toolcalls.tool_plan(spec, renders_tools=True, token_of=lambda _: 7,
                                   tokenize=lambda _: [1])  # fmt: skip

    plan = plan_of({"type": "function", "function": {"name": "set_timer"}})
    opened = toolcalls.call_opening("set_timer")
    assert plan is not None and plan.start_in_call and plan.opening == opened
    required = plan_of("required")
    assert required is not None and required.start_in_call and required.opening == ""
    assert toolcalls.parse_call(opened + '{"minutes": 5}}').name == "set_timer"
    # the rest of `{"name": "set_timer", "arguments": {"minutes": 5}}` after the opening: the
    # name was the request's, so the arguments' part is the figure
    pieces, lps = [" {", '"minutes', '":', " ", "5", "}}"], [0.0, 0.0, 0.0, 0.0, lp(0.25), 0.0]
    assert toolcalls.call_confidence(pieces, lps, opened) == pytest.approx(0.25 ** (1 / 6))


def test_the_name_a_call_written_as_json_states_is_read_once_complete() -> None:
    assert toolcalls.intended_name('```json\n{\n  "name": "get_wea') is None
    assert toolcalls.intended_name('{"name": "get_weather", "argu') == "get_weather"
    assert toolcalls.intended_name('{ "name" : "a\\"b"') == 'a"b'
    spec = tool_spec([{"type": "function", "function": {"name": "math_factorial"}}], "auto", None)
    assert spec is not None
    assert toolcalls.offered("math_factorial", spec) and toolcalls.offered("math.factorial", spec)
    assert not toolcalls.offered("calculate_triangle_area", spec)
