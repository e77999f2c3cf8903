"""Checks at the API's edge: every public argument is checked before any work, and a failure is
one `InvalidArgumentError` naming the argument, the value and the rule.

The rules for a request (`HybridClient.stream` / `complete`, `GenerationRequest`):

    messages      a non-blank prompt string, or a non-empty sequence of {"role", "content"}
                  mappings (role: system, user, assistant, developer, tool; content: a string,
                  or OpenAI's list of text parts, joined; an optional non-blank "name"); the last
                  user message (else some message) must
                  hold non-blank text. An assistant message may carry `tool_calls` (OpenAI's
                  shape; its content may then be None or empty, kept as ""), and a "tool"
                  message the `tool_call_id` of a call made earlier in the conversation. Any
                  other field is refused, never dropped (the legacy `function_call` and
                  "function" role: use `tool_calls`)
    max_tokens    an int from 1 to 1048576 (`MAX_TOKENS`, 2**20: no engine's context is larger;
                  not a bool); an engine that knows its context sends at most what it leaves
    temperature   a finite number from 0 to 2
    top_p         a finite number in (0, 1]
    stop          a non-empty string, or a sequence of at most 16 non-empty strings
    seed          an int from 0 to 4294967295 (2**32 - 1: what llama.cpp and OpenAI both take)
    policy        a non-blank policy name or path, a `Policy`, or None

Engine constructors and CLI options use the same helpers (`integer`, `number`, `flag`, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hybridllm.errors import InvalidArgumentError
from hybridllm.policy import MAX_TOKENS, Policy

__all__ = [
    "MAX_SEED",
    "MAX_TOKENS",
    "MAX_STOP",
    "ROLES",
    "directory",
    "flag",
    "integer",
    "max_tokens",
    "messages",
    "number",
    "one_of",
    "policy_ref",
    "seed",
    "stop",
    "temperature",
    "text",
    "top_p",
]

ROLES = ("system", "user", "assistant", "developer", "tool")
FIELDS = ("role", "content", "name")  # what any message may hold (nothing else is dropped)
LEGACY_ROLES = ("function",)
LEGACY = "the legacy function-calling fields are not supported: use tool_calls and tool messages"
MAX_SEED = 2**32 - 1
MAX_STOP = 16
T = TypeVar("T")


def integer(
    argument: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An int (not a bool, not a float, not a string) within [minimum, maximum]."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:  # type: ignore[operator]
        ok = False
    if ok and maximum is not None and value > maximum:  # type: ignore[operator]
        ok = False
    if not ok:
        raise InvalidArgumentError(argument, value, _range("an int", minimum, maximum))
    assert isinstance(value, int)
    return value


def number(
    argument: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
) -> float:
    """A finite int or float (not a bool, not NaN or inf) within [minimum, maximum], and
    strictly greater than `above` when given."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (
            math.isfinite(v)
            and (minimum is None or v >= minimum)
            and (maximum is None or v <= maximum)
            and (above is None or v > above)
        )
    if not ok:
        if above is not None:
            rule = f"a finite number > {above:g}" + (
                "" if maximum is None else f" and <= {maximum:g}"
            )
        else:
            rule = _range("a finite number", minimum, maximum)
        raise InvalidArgumentError(argument, value, rule)
    return float(value)  # type: ignore[arg-type]


def flag(argument: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(argument, value, "True or False")
    return value


def text(argument: str, value: object, *, blank_ok: bool = False) -> str:
    """A string (non-blank unless `blank_ok`)."""
    if not isinstance(value, str) or (not blank_ok and not value.strip()):
        raise InvalidArgumentError(
            argument, value, "a string" if blank_ok else "a non-blank string"
        )
    return value


CONVERSATION_CHARS = 256
USER_CHARS = 256


def short_id(argument: str, value: object, limit: int) -> str:
    """An app's id for something (a conversation, an end user): a non-blank string of at most
    `limit` characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidArgumentError(
            argument, value, f"a non-blank string of at most {limit} characters"
        )
    return value


def conversation(value: object) -> str:
    """An app's conversation key: a non-blank string of at most `CONVERSATION_CHARS`."""
    return short_id("conversation", value, CONVERSATION_CHARS)


def user(value: object) -> str:
    """An end user's id (`stream(user=)`): a non-blank string of at most `USER_CHARS`."""
    return short_id("user", value, USER_CHARS)


def one_of(argument: str, value: object, choices: Sequence[T]) -> T:
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return choice
    raise InvalidArgumentError(argument, value, "one of " + ", ".join(map(repr, choices)))


# an engine's name (`HybridClient(engines=)`): it names the engine in events, traces, stats,
# logs and policies
ENGINE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
# names a policy gives a meaning of its own ("auto": the router chooses)
RESERVED_ENGINE_NAMES = ("auto",)


def engine_name(argument: str, value: object) -> str:
    """An engine's name: a letter, then up to 39 letters, digits, "_", "." or "-" ("auto" is a
    policy's word for the router's choice)."""
    if (
        not isinstance(value, str)
        or not ENGINE_NAME.fullmatch(value)
        or value in RESERVED_ENGINE_NAMES
    ):
        rule = 'a name such as "fast" (a letter, then letters, digits, _ . -; not "auto")'
        raise InvalidArgumentError(argument, value, rule)
    return value


def directory(argument: str, value: object) -> Path:
    """An existing directory (a str or a Path)."""
    if not isinstance(value, str | Path) or not str(value).strip():
        raise InvalidArgumentError(argument, value, "a directory path (str or Path)")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise InvalidArgumentError(argument, value, "an existing directory")
    return path


def policy_ref(value: object, argument: str = "policy") -> str | Path | Policy | None:
    """A policy name or path (non-blank), a `Policy`, or None."""
    if value is None or isinstance(value, Path | Policy):
        return value
    if isinstance(value, str) and value.strip():
        return value
    raise InvalidArgumentError(argument, value, "a policy name, a path or a Policy")


# ---- a request ----------------------------------------------------------------------------------


def max_tokens(value: object) -> int:
    return integer("max_tokens", value, minimum=1, maximum=MAX_TOKENS)


def temperature(value: object) -> float:
    return number("temperature", value, minimum=0.0, maximum=2.0)


def top_p(value: object) -> float:
    return number("top_p", value, above=0.0, maximum=1.0)


def seed(value: object) -> int | None:
    return None if value is None else integer("seed", value, minimum=0, maximum=MAX_SEED)


def stop(value: object) -> tuple[str, ...]:
    """A string or a sequence of strings, as a tuple; each one non-empty."""
    single = isinstance(value, str)
    if single:
        value = (value,)
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise InvalidArgumentError("stop", value, "a string or a sequence of strings")
    out = tuple(value)
    if len(out) > MAX_STOP:
        raise InvalidArgumentError("stop", value, f"at most {MAX_STOP} strings")
    for i, s in enumerate(out):
        if not isinstance(s, str) or not s:
            raise InvalidArgumentError("stop" if single else f"stop[{i}]", s, "a non-empty string")
    return out


def messages(value: object) -> tuple[dict[str, Any], ...]:
    """A prompt string becomes one user message; a list of messages is checked one by one."""
    if isinstance(value, str):
        if not value.strip():
            raise InvalidArgumentError("messages", value, "a prompt with some non-blank text")
        return ({"role": "user", "content": value},)
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, bytes):
        raise InvalidArgumentError(
            "messages", value, "a prompt string or a sequence of {'role', 'content'} mappings"
        )
    out = [_message(i, m) for i, m in enumerate(value)]
    if not out:
        raise InvalidArgumentError("messages", value, "a non-empty sequence of messages")
    _tool_results_answer_calls(out)
    users = [i for i, m in enumerate(out) if m["role"] == "user"]
    if users and not out[users[-1]]["content"].strip():
        i = users[-1]
        raise InvalidArgumentError(
            f"messages[{i}].content", out[i]["content"], "non-blank text (the last user message)"
        )
    if not any(m["content"].strip() or m.get("tool_calls") for m in out):
        raise InvalidArgumentError("messages", value, "a conversation with some non-blank text")
    return tuple(out)


def _message(i: int, m: object) -> dict[str, Any]:
    """One message, every field kept: role, content, an optional name, an assistant's tool
    calls, a tool result's call id; any other field is refused, so nothing the caller wrote is
    silently dropped."""
    if not isinstance(m, Mapping):
        raise InvalidArgumentError(f"messages[{i}]", m, "a mapping with role and content")
    role = m.get("role")
    if role in LEGACY_ROLES or "function_call" in m:
        key = "role" if role in LEGACY_ROLES else "function_call"
        raise InvalidArgumentError(f"messages[{i}].{key}", m[key], f"absent: {LEGACY}")
    if role not in ROLES:
        raise InvalidArgumentError(f"messages[{i}].role", role, "one of " + ", ".join(ROLES))
    allowed = FIELDS + (("tool_calls",) if role == "assistant" else ())
    allowed += ("tool_call_id",) if role == "tool" else ()
    for key in m:
        if key not in allowed:
            rule = f"absent: a {role} message holds only " + ", ".join(allowed)
            raise InvalidArgumentError(f"messages[{i}].{key}", m[key], rule)
    calls = _tool_calls(i, m["tool_calls"]) if "tool_calls" in m else None
    content = m.get("content")
    if content is None and calls:
        content = ""  # an assistant turn that only calls tools
    out: dict[str, Any] = {"role": str(role), "content": _content(i, content)}
    if "name" in m:
        out["name"] = text(f"messages[{i}].name", m["name"])
    if calls:
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = text(f"messages[{i}].tool_call_id", m.get("tool_call_id"))
    return out


def _content(i: int, content: object) -> str:
    """A message's content: a string, or OpenAI's list of text parts (`[{"type": "text",
    "text": ...}]`, joined as the gateway joins them). Any other part (an image, audio) is
    refused, naming it: no engine here takes it (the local engine and the cloud engine send
    text only)."""
    if isinstance(content, str):
        return content
    if isinstance(content, str | bytes | Mapping) or not isinstance(content, Sequence):
        raise InvalidArgumentError(
            f"messages[{i}].content", content, "a string or a list of text parts"
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"a {kind!r} part" if isinstance(kind, str) else "that"
            rule = (
                "a text part {'type': 'text', 'text': ...}: neither the local nor the cloud "
                f"engine takes {what}"
            )
            raise InvalidArgumentError(f"messages[{i}].content[{j}]", part, rule)
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(i: int, value: object) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, in OpenAI's shape, copied."""
    at = f"messages[{i}].tool_calls"
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidArgumentError(at, value, "a list of {'id', 'type', 'function'} calls")
    out: list[dict[str, Any]] = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or call.get("type") != "function" or fn is None:
            rule = "{'id': ..., 'type': 'function', 'function': {'name', 'arguments'}}"
            raise InvalidArgumentError(f"{at}[{j}]", call, rule)
        if not isinstance(fn, Mapping):
            raise InvalidArgumentError(f"{at}[{j}].function", fn, "a mapping")
        name = text(f"{at}[{j}].function.name", fn.get("name"))
        arguments = text(f"{at}[{j}].function.arguments", fn.get("arguments"), blank_ok=True)
        call_id = text(f"{at}[{j}].id", call.get("id"))
        function = {"name": name, "arguments": arguments}
        out.append({"id": call_id, "type": "function", "function": function})
    return out


def _tool_results_answer_calls(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every "tool" message answers a call an earlier assistant message made."""
    made: set[str] = set()
    for i, m in enumerate(messages):
        made.update(c["id"] for c in m.get("tool_calls", ()))
        if m["role"] == "tool" and m["tool_call_id"] not in made:
            rule = "the id of a tool call an earlier assistant message made"
            raise InvalidArgumentError(f"messages[{i}].tool_call_id", m["tool_call_id"], rule)


def _range(what: str, minimum: float | None, maximum: float | None) -> str:
    lo, hi = _bound(minimum), _bound(maximum)
    if minimum is not None and maximum is not None:
        return f"{what} from {lo} to {hi}"
    if minimum is not None:
        return f"{what} >= {lo}"
    if maximum is not None:
        return f"{what} <= {hi}"
    return what


def _bound(x: float | None) -> str:
    """A bound as people write it: an int whole (1048576, not 1.04858e+06), a float short."""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return "" if x is None else f"{x:g}"
