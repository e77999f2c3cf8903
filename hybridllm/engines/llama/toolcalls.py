"""Tool calls and JSON answers on a local model: the model's own call markup, and grammars.

A chat template that knows tools (Qwen2.5's) writes the tool definitions into the system turn
and asks for each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

where `<tool_call>` is one special token of the vocabulary. `ToolPlan` holds what a session needs
to produce such calls well-formed by construction: that trigger token, a llama.cpp grammar (GBNF)
for the call's JSON, `{"name": <one of the callable names>, "arguments": <that tool's
parameters schema>}`, and the tokens that close a call. The grammar comes from llama.cpp's own
JSON Schema converter (`llama_cpp.llama_grammar.json_schema_to_gbnf`), given a `oneOf` over the
callable tools, so a call's arguments always parse and match the schema's types, required fields
and enums (an object schema without `additionalProperties` admits no other key). A JSON answer
(`response_format`) gets the grammar of its schema, or of any JSON object.

A schema the converter cannot turn into a grammar (a remote `$ref`, ...) is an
`InvalidArgumentError` naming the argument: the local engine cannot constrain it.

Assistant messages carrying `tool_calls` hold their arguments as JSON text (OpenAI's shape);
templates written for Hugging Face expect the parsed object (Qwen's writes
`arguments | tojson`), so `template_messages` parses them before rendering.
"""

from __future__ import annotations

import functools
import json
import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridllm.errors import InvalidArgumentError
from hybridllm.local import loader
from hybridllm.tools import ResponseFormat, Tool, ToolSpec

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "JSON_OPENINGS",
    "ParsedCall",
    "ToolPlan",
    "answer_gbnf",
    "call_gbnf",
    "call_confidence",
    "call_opening",
    "call_id",
    "call_schema",
    "check_spec",
    "confidence",
    "intended_name",
    "json_opening",
    "offered",
    "parse_call",
    "template_messages",
    "tool_plan",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "\n</tool_call>"
_BODY = "hybridllm-body"  # the converted schema's root, renamed under our own root rule


@dataclass(frozen=True)
class ToolPlan:
    """How one request's answer is generated. `trigger`: the token opening a call (None: the
    answer may not call); `call_grammar`: GBNF of a call's JSON; `answer_grammar`: GBNF of the
    whole text answer (a JSON response format); `start_in_call`: the answer is a call from its
    first token (tool_choice "required" or a named tool); `banned`: tokens never sampled (the
    trigger under tool_choice "none"); `close`: the tokens written after a call's JSON;
    `opening`: where `tool_choice` names the function, the call's JSON up to its arguments
    (`call_opening`: nothing in it is the model's to choose, so it is read with the prompt, in
    one batch, instead of decoded a token at a time)."""

    trigger: int | None = None
    call_grammar: str | None = None
    answer_grammar: str | None = None
    start_in_call: bool = False
    banned: tuple[int, ...] = ()
    close: tuple[int, ...] = ()
    opening: str = ""


@dataclass(frozen=True)
class ParsedCall:
    """One call as generated: a fresh id, the tool's name, its arguments as compact JSON text,
    and the model's confidence in it (`confidence`: `call_confidence`, from its probabilities of
    the call's tokens before the grammar; None: not measured)."""

    id: str
    name: str
    arguments: str
    confidence: float | None = None


def call_id() -> str:
    """A fresh id in OpenAI's style."""
    return f"call_{secrets.token_hex(12)}"


def tool_plan(
    spec: ToolSpec | None,
    *,
    renders_tools: bool,
    token_of: Callable[[str], int | None],
    tokenize: Callable[[str], list[int]],
) -> ToolPlan | None:
    """The plan for a request's `spec` (None: plain text). `renders_tools`: the chat template
    writes tool definitions; `token_of`: the single token a special text is (None: not one).
    A model that cannot call (its template ignores tools, or no `<tool_call>` token) is an
    `InvalidArgumentError` on "tools" when the request has tools."""
    if spec is None or (not spec.tools and spec.response_format is None):
        return None
    fmt = spec.response_format
    answer = answer_gbnf(fmt) if fmt is not None else None
    if not spec.tools:
        return ToolPlan(answer_grammar=answer)
    trigger = token_of(CALL_OPEN)
    if not renders_tools or trigger is None:
        rule = "a local model whose chat template renders tools and has a <tool_call> token"
        raise InvalidArgumentError("tools", [t.name for t in spec.tools], rule)
    if not spec.may_call:  # "none": the tools are shown, a call is never started
        return ToolPlan(answer_grammar=answer, banned=(trigger,))
    return ToolPlan(
        trigger=trigger,
        call_grammar=call_gbnf(spec.callable_tools),
        answer_grammar=answer,
        start_in_call=spec.must_call,
        close=tuple(tokenize(CALL_CLOSE)),
        opening=call_opening(spec.forced) if spec.forced is not None else "",
    )


def call_opening(name: str) -> str:
    """The text a call to `name` opens with after `<tool_call>`, as the template writes it and
    the call grammar (`call_gbnf`) admits it: up to its arguments' colon (the model writes the
    space and brace after it as one token, ` {`, which a space written here would split)."""
    return '\n{"name": ' + json.dumps(name) + ', "arguments":'


def call_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    """The JSON Schema of one call's JSON: `{"name": <const>, "arguments": <parameters>}` for
    one tool, a `oneOf` of those for several."""
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": dict(t.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    if not alternatives:
        raise InvalidArgumentError("tools", [], "at least one tool the answer may call")
    return alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}


def call_gbnf(tools: Sequence[Tool]) -> str:
    """GBNF of a call's JSON after the `<tool_call>` token (an optional newline first, as the
    template writes it)."""
    return _gbnf(call_schema(tools), "tools", lead='"\\n"? ')


def answer_gbnf(fmt: ResponseFormat) -> str:
    """GBNF of a whole JSON answer: the schema's, or any JSON object's."""
    if fmt.schema is None:
        return _gbnf({"type": "object"}, "response_format", lead="")
    return _gbnf(dict(fmt.schema), "response_format.json_schema.schema", lead="")


def check_spec(spec: ToolSpec) -> None:
    """Whether the local engine can constrain `spec`'s call and answer: each schema converts
    to a grammar, or `InvalidArgumentError` naming the argument (before anything is sent)."""
    if spec.response_format is not None:
        answer_gbnf(spec.response_format)
    if spec.callable_tools:
        call_gbnf(spec.callable_tools)


def _gbnf(schema: Mapping[str, Any], at: str, *, lead: str) -> str:
    try:
        body = _converted(json.dumps(_bare_as_any(schema)))
    except (ValueError, KeyError, TypeError, NotImplementedError, AssertionError) as exc:
        rule = f"a schema llama.cpp's grammar converter supports ({exc})"
        raise InvalidArgumentError(at, schema, rule) from None
    lines = [
        f"{_BODY} ::={line[len('root ::=') :]}" if line.startswith("root ::=") else line
        for line in body.splitlines()
    ]
    return f"root ::= {lead}{_BODY}\n" + "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=256)
def _converted(schema_json: str) -> str:
    """llama.cpp's GBNF of a schema (JSON text), converted once per schema."""
    grammars = loader.llama_cpp_part("llama_grammar")  # heavy: only when constraining
    return str(grammars.json_schema_to_gbnf(schema_json))


# keywords that describe a schema without constraining it
_ANNOTATIONS = frozenset(
    "description title examples default $comment deprecated readOnly writeOnly".split()
)
_ANY_VALUE = {"type": ["string", "number", "boolean", "object", "array", "null"]}
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("oneOf", "anyOf", "allOf", "prefixItems")


def _bare_as_any(schema: Any) -> Any:
    """`schema` with every subschema that only describes (`{"description": ...}`: any value, in
    JSON Schema) spelt as a union of every type: llama.cpp's converter refuses such a schema,
    and reads `{}` as any object."""
    if not isinstance(schema, Mapping):
        return schema
    if schema and set(schema) <= _ANNOTATIONS:
        return dict(_ANY_VALUE)
    out = dict(schema)
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = _bare_as_any(out[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: _bare_as_any(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_bare_as_any(sub) for sub in out[key]]
    return out


def parse_call(text: str) -> ParsedCall:
    """A call's JSON as generated (`{"name": ..., "arguments": {...}}`, whitespace around it);
    `ValueError` when it is not that shape."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("a call must be an object with a string name")
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # a model writing the arguments as JSON text
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("a call's arguments must be an object")
    compact = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    return ParsedCall(call_id(), data["name"], compact)


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates expect them: an assistant's tool calls with their
    arguments parsed (text that does not parse is kept as text)."""
    return [_templated(m) for m in messages]


def _templated(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_parsed_call(c) for c in calls]
    return out


def _parsed_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args or "{}")
        except ValueError:
            pass
    return {**call, "function": fn}


# how an answer that writes its call as a JSON object, or a fenced JSON block, instead of the
# template's markup opens (the coder models do so): whitespace removed
JSON_OPENINGS = ("{", "```json{", "```{")


def json_opening(text: str) -> bool | None:
    """Whether an answer's first text opens a call written as JSON (True), cannot (False), or
    may still (None: too short to tell)."""
    s = "".join(text.split())
    if any(s.startswith(o) for o in JSON_OPENINGS):
        return True
    return None if any(o.startswith(s) for o in JSON_OPENINGS) else False


def confidence(logprobs: Sequence[float]) -> float | None:
    """The geometric mean of the probabilities whose logs these are (None: none)."""
    return math.exp(sum(logprobs) / len(logprobs)) if logprobs else None


def call_confidence(
    pieces: Sequence[str], logprobs: Sequence[float], opened: str = ""
) -> float | None:
    """A call's confidence from its JSON's tokens (`pieces`, their texts) and their
    log-probabilities: the lower of the geometric means over the name's part (from `"name"`
    to `"arguments"`) and the arguments' part (the rest). The markup before the name is left
    out: the grammar forces it, and its first token (`{"`) is where the model, left alone,
    would have written a code fence, so its probability says nothing of the call. A call
    whose parts cannot be told apart gets the geometric mean of all its tokens. `opened`: the
    call's text written for the model before `pieces` (`call_opening`: a name the request chose,
    so the arguments' part alone counts)."""
    parts: dict[str, list[float]] = {"head": [], "name": [], "arguments": []}
    text = opened
    part = "arguments" if '"arguments"' in text else "name" if '"name"' in text else "head"
    for piece, lp in zip(pieces, logprobs, strict=True):
        parts[part].append(lp)
        text += piece
        if part == "head" and '"name"' in text:
            part = "name"
        elif part == "name" and '"arguments"' in text:
            part = "arguments"
    figures = [confidence(parts["name"]), confidence(parts["arguments"])]
    known = [f for f in figures if f is not None]
    return min(known) if known else confidence(logprobs)


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
NAME_WAIT_CHARS = 160  # how much of a JSON opening is read for the name it calls, at most


def intended_name(text: str) -> str | None:
    """The function name a call written as JSON states, once its string is complete (None:
    not yet, or none)."""
    found = _NAME.search(text)
    return json.loads(f'"{found.group(1)}"') if found else None


def offered(name: str, spec: ToolSpec) -> bool:
    """Whether `name` is a tool the answer may call (a dotted name the way BFCL-style tools
    are written, "math.factorial", counts as its OpenAI form "math_factorial")."""
    names = {t.name for t in spec.callable_tools}
    return name in names or name.replace(".", "_") in names
