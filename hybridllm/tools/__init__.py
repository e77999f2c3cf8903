"""Tools and structured output: OpenAI's chat-completions shapes, checked at the edge.

    spec = tool_spec(tools=[{"type": "function", "function": {"name": "set_timer",
                                                             "parameters": {...}}}],
                     tool_choice="auto", response_format=None)
    args = check_call(spec, "set_timer", '{"minutes": 5}')   # the parsed arguments, or raises

`tool_spec` turns the three request arguments into one `ToolSpec` (None when none is given):
a malformed tool definition, a `tool_choice` naming an unknown tool or a response format
without a usable schema is an `InvalidArgumentError` naming the argument ("tools[1].function.
parameters", "tool_choice", "response_format.json_schema.schema"), before anything is sent.
The shapes given are kept as given (`ToolSpec.wire()`): a cloud receives exactly them.

`check_call` and `check_answer` check what an engine produced against the spec: a call to a
tool that exists, with arguments that parse as a JSON object valid against its parameters'
schema; a JSON answer valid against the response format's schema. A failure is an
`InvalidOutputError` (an `EngineError`: the request escalates to the other engine where the
policy allows, and nothing of it reaches the app). jsonschema does the checking (Draft 2020-12
unless the schema names another draft); it is imported on first use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridllm.errors import InvalidArgumentError, InvalidOutputError
from hybridllm.tools.keywords import unknown_keywords

__all__ = [
    "ResponseFormat",
    "Tool",
    "ToolChoiceMode",
    "ToolSpec",
    "check_answer",
    "check_call",
    "tool_spec",
    "written_call",
]

ToolChoiceMode = Literal["auto", "none", "required"]
CHOICES: tuple[ToolChoiceMode, ...] = ("auto", "none", "required")
FORMATS = ("text", "json_object", "json_schema")
log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # schemas (as JSON text) whose unknown keywords were logged
_WARNED_MAX = 1024
MAX_TOOLS = 128  # OpenAI's own bound on `tools`
# what OpenAI allows in a function or schema name (no dots: a cloud would refuse one with a 400)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}
# what opens a call or the tools' list in common chat templates (Qwen's and Hermes', Llama 3's,
# Mistral's, Functionary's): written as plain text, it is a malformed call, never an answer
CALL_MARKUP = ("<tools>", "<tool_call>", "<function=", "<|python_tag|>", "[TOOL_CALLS]")


@dataclass(frozen=True)
class Tool:
    """One function tool: `parameters` is its JSON Schema (an object schema; a tool defined
    without one takes no arguments), `raw` the definition as given."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    strict: bool | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class ResponseFormat:
    """`type` "json_object" (any JSON object) or "json_schema" (`schema`, named `name`)."""

    type: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None
    name: str | None
    strict: bool | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools, tool choice and response format, checked. `forced`: the one tool
    `tool_choice` names (then `choice` is "required")."""

    tools: tuple[Tool, ...] = ()
    choice: ToolChoiceMode = "auto"
    forced: str | None = None
    response_format: ResponseFormat | None = None
    raw_choice: object = None  # `tool_choice` as given (None: not given)
    # `response_format` as given (None: not given); {"type": "text"} is sent though it asks
    # for what happens anyway (`response_format` is then None)
    raw_format: object = None
    # a call whose engine's confidence is below this is not delivered (`UnsureCallError`): set
    # by the plan where another engine can answer instead (None: every valid call stands)
    min_call_confidence: float | None = None
    # a first call to a tool whose name the request hardly states (`hybridllm.tools.fit`) is not
    # delivered (`UnfitCallError`): set by the plan like `min_call_confidence`
    min_tool_fit: float | None = None

    @property
    def may_call(self) -> bool:
        """Whether an answer may be a tool call."""
        return bool(self.tools) and self.choice != "none"

    @property
    def must_call(self) -> bool:
        return bool(self.tools) and self.choice == "required"

    @property
    def callable_tools(self) -> tuple[Tool, ...]:
        """The tools an answer may call (the forced one alone, when `tool_choice` names one)."""
        if not self.may_call:
            return ()
        return tuple(t for t in self.tools if self.forced in (None, t.name))

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def wire(self) -> dict[str, Any]:
        """The body fields a chat-completions endpoint receives, as the caller gave them."""
        out: dict[str, Any] = {}
        if self.tools:
            out["tools"] = [dict(t.raw) for t in self.tools]
        if self.raw_choice is not None:
            out["tool_choice"] = self.raw_choice
        if isinstance(self.raw_format, Mapping):
            out["response_format"] = dict(self.raw_format)
        return out


def tool_spec(tools: object, tool_choice: object, response_format: object) -> ToolSpec | None:
    """The checked spec of a request's `tools`, `tool_choice` and `response_format` (None for
    each: not given; all three None: no spec)."""
    if tools is None and tool_choice is None and response_format is None:
        return None
    defined = _tools(tools)
    choice, forced = _choice(tool_choice, defined)
    fmt = _response_format(response_format)
    return ToolSpec(defined, choice, forced, fmt, tool_choice, raw_format=response_format)


# ---- the arguments --------------------------------------------------------------------------


def _tools(value: object) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidArgumentError("tools", value, "a list of {'type': 'function', ...} tools")
    if len(value) > MAX_TOOLS:
        raise InvalidArgumentError("tools", f"{len(value)} tools", f"at most {MAX_TOOLS} tools")
    out = [_tool(f"tools[{i}]", t) for i, t in enumerate(value)]
    seen: set[str] = set()
    for i, t in enumerate(out):
        if t.name in seen:
            raise InvalidArgumentError(f"tools[{i}].function.name", t.name, "a unique name")
        seen.add(t.name)
    return tuple(out)


def _tool(at: str, value: object) -> Tool:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(at, value, "a mapping {'type': 'function', 'function': {...}}")
    if value.get("type") != "function":
        raise InvalidArgumentError(f"{at}.type", value.get("type"), "'function'")
    fn = value.get("function")
    if not isinstance(fn, Mapping):
        raise InvalidArgumentError(f"{at}.function", fn, "a mapping with a name")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or set(name) - _NAME_CHARS:
        rule = "a name of 1 to 64 letters, digits, '_' or '-' (OpenAI's rule)"
        raise InvalidArgumentError(f"{at}.function.name", name, rule)
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise InvalidArgumentError(f"{at}.function.description", description, "a string")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidArgumentError(f"{at}.function.strict", strict, "True, False or absent")
    parameters = fn.get("parameters", EMPTY_PARAMETERS)
    _object_schema(f"{at}.function.parameters", parameters, strict=strict is True)
    return Tool(name, description, parameters, strict, value)


def _choice(value: object, tools: Sequence[Tool]) -> tuple[ToolChoiceMode, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        for choice in CHOICES:
            if value == choice:
                if choice != "none" and not tools:
                    rule = "'none' or absent when no tools are given"
                    raise InvalidArgumentError("tool_choice", value, rule)
                return choice, None
        raise InvalidArgumentError("tool_choice", value, "'auto', 'none', 'required' or a tool")
    fn = value.get("function") if isinstance(value, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(value, Mapping) or value.get("type") != "function" or name is None:
        rule = "'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"
        raise InvalidArgumentError("tool_choice", value, rule)
    if not any(t.name == name for t in tools):
        known = ", ".join(t.name for t in tools) or "none given"
        raise InvalidArgumentError("tool_choice", value, f"a tool given in tools ({known})")
    return "required", str(name)


def _response_format(value: object) -> ResponseFormat | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or kind not in FORMATS:
        rule = "{'type': 'text' | 'json_object' | 'json_schema', ...}"
        raise InvalidArgumentError("response_format", value, rule)
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object", None, None, None, value)
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        rule = "a mapping {'name': ..., 'schema': {...}}"
        raise InvalidArgumentError("response_format.json_schema", spec, rule)
    name = spec.get("name")
    if not isinstance(name, str) or not name or set(name) - _NAME_CHARS or len(name) > 64:
        rule = "a name of 1 to 64 letters, digits, '_' or '-'"
        raise InvalidArgumentError("response_format.json_schema.name", name, rule)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidArgumentError("response_format.json_schema.strict", strict, "a bool")
    schema = spec.get("schema")
    _schema("response_format.json_schema.schema", schema, strict=strict is True)
    assert isinstance(schema, Mapping)
    return ResponseFormat("json_schema", schema, name, strict, value)


def _object_schema(at: str, schema: object, *, strict: bool) -> None:
    _schema(at, schema, strict=strict)
    assert isinstance(schema, Mapping)
    if schema.get("type", "object") != "object":
        raise InvalidArgumentError(f"{at}.type", schema.get("type"), "'object'")


def _schema(at: str, schema: object, *, strict: bool) -> None:
    """A JSON Schema that is itself valid (against its draft's meta-schema), whose keywords
    are all known (`keywords`): an unknown one is logged at WARNING once per schema, or
    refused under `strict`."""
    if not isinstance(schema, Mapping):
        raise InvalidArgumentError(at, schema, "a JSON Schema (a mapping)")
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(at, schema, f"JSON data ({exc})") from None
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(dict(schema))
    except exceptions.SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.absolute_path)
        raise InvalidArgumentError(f"{at}{where}", exc.instance, f"valid ({exc.message})") from None
    _known_keywords(at, schema, strict=strict)


def _known_keywords(at: str, schema: Mapping[str, Any], *, strict: bool) -> None:
    text = json.dumps(schema, sort_keys=True)
    if not strict and text in _WARNED:
        return
    unknown = unknown_keywords(schema)
    if unknown and strict:
        first = unknown[0]
        rule = "a known JSON Schema keyword under strict: true" + (
            f" (did you mean {first.closest!r}?)" if first.closest else ""
        )
        raise InvalidArgumentError(f"{at}.{first.path}", first.keyword, rule)
    if len(_WARNED) < _WARNED_MAX:
        _WARNED.add(text)
    for u in unknown:
        meant = f" (did you mean {u.closest!r}?)" if u.closest else ""
        log.warning(
            "%s.%s: unknown JSON Schema keyword %r, which constrains nothing%s",
            at,
            u.path,
            u.keyword,
            meant,
        )


# ---- what an engine produced ------------------------------------------------------------------


def check_call(spec: ToolSpec, name: str, arguments: str, *, engine: str) -> Any:
    """The parsed arguments of a call `engine` produced; `InvalidOutputError` when the tool is
    not one it may call, or the arguments do not parse or do not match its schema."""
    tool = next((t for t in spec.callable_tools if t.name == name), None)
    if tool is None:
        allowed = ", ".join(t.name for t in spec.callable_tools) or "none"
        problem = f"a call to {name!r}, which is not a tool it may call ({allowed})"
        raise InvalidOutputError(engine, "tool_call", f"{name}({arguments})", problem)
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as exc:
        problem = f"arguments that are not JSON ({exc})"
        raise InvalidOutputError(engine, "tool_call", f"{name}({arguments})", problem) from None
    wrong = _violation(tool.parameters, parsed)
    if not isinstance(parsed, dict):  # OpenAI's shape, whatever the schema's "type" says
        wrong = f"arguments that are not a JSON object ({type(parsed).__name__})"
    if wrong is not None:
        raise InvalidOutputError(engine, "tool_call", f"{name}({arguments})", wrong)
    return parsed


def written_call(text: str) -> bool | None:
    """Whether a text answer opens with a chat template's call markup written as plain text
    (`CALL_MARKUP`: a small model's malformed call, or its echo of the tools' list): True,
    False, or None while its start could still become such markup."""
    head = text.lstrip()
    if head.startswith(CALL_MARKUP):
        return True
    if any(marker.startswith(head) for marker in CALL_MARKUP):
        return None
    return False


def check_answer(spec: ToolSpec, text: str, *, engine: str) -> Any:
    """The parsed JSON answer to a request with a JSON response format; `InvalidOutputError`
    when it does not parse, is not an object (json_object) or does not match the schema."""
    fmt = spec.response_format
    assert fmt is not None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        problem = f"an answer that is not JSON ({exc})"
        raise InvalidOutputError(engine, "json", text, problem) from None
    schema = fmt.schema if fmt.schema is not None else {"type": "object"}
    wrong = _violation(schema, parsed)
    if wrong is not None:
        raise InvalidOutputError(engine, "json", text, wrong)
    return parsed


def _violation(schema: Mapping[str, Any], instance: Any) -> str | None:
    from jsonschema import validators

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    error = next(iter(cls(dict(schema)).iter_errors(instance)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    return f"a value that breaks the schema at {where}: {error.message}"
