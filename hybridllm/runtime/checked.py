"""What an engine produced, checked against the request's tools and response format before any
of it reaches a plan (every plan streams through `RequestRun.relay`, which wraps each engine
stream in `checked`): one home for the rule that an invalid tool call or JSON answer is never
delivered.

- A tool call (`Called`) passes only when `hybridllm.tools.check_call` accepts it: a tool the
  request lets the answer call, with arguments that parse and match its schema.
- With a JSON response format, the answer's text is held until the engine finishes, checked
  whole (`check_answer`) and handed on as one piece: a JSON answer is atomic, like a call.
  While it is held, each time the text so far parses into a new object (a partial parse: the
  last string cut where the text is) a `Partial` mark carries it on (the app's `PartialJSON`
  events: provisional, taken back by the stream if the answer then fails its check).
- A first call whose engine's own confidence is below the spec's `min_call_confidence` (the
  policy's `[tools]` bound, set by the plan only where the cloud can answer instead) is not
  delivered either (`UnsureCallError`), nor one to a tool whose name the request hardly states
  (`hybridllm.tools.fit` below `min_tool_fit`: `UnfitCallError`); a later call of the same
  answer stands (the first was delivered: the answer cannot move to the other engine any more).
  Both bounds judge the local engine's calls only: the cloud is where an unsure call goes.
- With `tool_choice` "required" (or a named tool), text is held until the call comes (then it
  goes first), and an answer that finishes without a call fails, its text never shown.
- An answer that may call and opens with a chat template's call markup written as plain text
  (`<tools>`, `<tool_call>`, ...: `tools.CALL_MARKUP`) fails the same way: a small model's
  malformed call, or its echo of the tools' list, is never delivered as an answer. Its first
  text is held only while it could still be such markup (an answer starting "The" is not).

- An answer to a tool result that is data (the request's last message is a tool message whose
  content is a JSON object or array) that only repeats that result (the local model echoing
  `{"ok": true, "minutes": 5}` back as its answer: the same text, give or take whitespace,
  quotes and a code fence) fails the same way (`what` "echo"), with or without tools in the
  request; a prose result read back is an answer. Its text is held only while it could still
  be such an echo (an answer starting "The timer" is not).

A failure is an `InvalidOutputError` raised before anything of the answer left the engine's
stream (text streamed before a call excepted): the plan treats it as the engine failing, so the
request escalates to the other engine where the policy allows, or the error reaches the app.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing

import pydantic_core

from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import InvalidOutputError, UnfitCallError, UnsureCallError
from hybridllm.events import Called, Chunk, Delta, Finish, Partial
from hybridllm.tools import ToolSpec, check_answer, check_call, written_call
from hybridllm.tools.fit import question_of, tool_fit

__all__ = ["checked"]


async def checked(
    chunks: AsyncGenerator[Chunk, None],
    request: GenerationRequest,
    engine: str,
    *,
    on_device: bool | None = None,
) -> AsyncGenerator[Chunk, None]:
    """`chunks`, with every tool call and JSON answer checked (the stream is always closed).
    `on_device`: the engine runs on the device (None: the engine named "local" does)."""
    local = engine == "local" if on_device is None else on_device
    spec = request.tools
    echoed = _tool_result(request)
    if echoed is not None:
        chunks = _no_echo(chunks, echoed, engine)
    async with aclosing(chunks) as inner:
        if spec is None:
            async for chunk in inner:
                yield chunk
            return
        hold = spec.response_format is not None or spec.must_call
        snapshots = spec.response_format is not None and not spec.may_call
        last: object = None  # the last snapshot of a JSON answer handed on
        held: list[Delta] = []  # a JSON answer's text until it is whole; text before a call
        # an answer that may call: its first text is held while it could be call markup
        sniff = spec.may_call and not hold
        calls = 0
        async for chunk in inner:
            if isinstance(chunk, Called):
                check_call(spec, chunk.name, chunk.arguments, engine=engine)
                # the bounds judge the local engine's first call: once a call is delivered,
                # the answer cannot move any more
                if not calls and local:
                    _sure(spec, chunk, engine)
                    _fits(request, spec, chunk, engine)
                calls, sniff = calls + 1, False
                for piece in held:  # text beside a call: not the answer, delivered with it
                    yield piece
                held.clear()
                yield chunk
            elif isinstance(chunk, Delta) and hold:
                held.append(chunk)
                if snapshots and chunk.text:
                    text = "".join(d.text for d in held)
                    value = snapshot(text)
                    if value is not None and value != last:
                        last = value
                        yield Partial(chunk.t, value=value, text=text)
            elif isinstance(chunk, Delta) and sniff:
                held.append(chunk)
                sniff = _markup(held, engine)
                if not sniff:
                    for piece in held:
                        yield piece
                    held.clear()
            elif isinstance(chunk, Finish):
                for piece in held if sniff else _answer(spec, held, calls, engine):
                    yield piece
                yield chunk
            else:
                yield chunk


def snapshot(text: str) -> object | None:
    """The JSON object (or array) `text` holds so far, parsed partially (its last string cut
    where the text is, a value not begun left out; a code fence's opening line skipped); None
    where it does not parse as the start of one."""
    body = text.lstrip()
    if body.startswith("```"):
        _, newline, body = body.partition("\n")
        if not newline:
            return None
    if not body.startswith(("{", "[")):
        return None
    try:
        value = pydantic_core.from_json(body, allow_partial="trailing-strings")
    except ValueError:
        return None
    return value if isinstance(value, dict | list) else None


def _tool_result(request: GenerationRequest) -> str | None:
    """The last tool message's text, normalized, where the request answers one and it is
    data, a JSON object or array (else None: a prose result read back is an answer)."""
    last = request.messages[-1] if request.messages else None
    if last is None or last.get("role") != "tool" or request.assistant_prefix:
        return None
    content = str(last.get("content") or "")
    try:  # data (a JSON object or array), not prose a user may be read back
        data = json.loads(content)
    except ValueError:
        return None
    return _bare(content) if isinstance(data, dict | list) else None


def _bare(text: str) -> str:
    """`text` without whitespace, quotes or a code fence (its language tag too, or what may
    still become one): how an echo is compared."""
    text = text.strip()
    if text.startswith("```"):
        head, newline, rest = text.lstrip("`").partition("\n")
        if not head.strip() or head.strip().isalpha():  # "```json", or "```js" so far
            text = rest if newline else ""
    text = text.replace("```", "")
    return "".join(c for c in text if not c.isspace() and c not in "'\"`")


async def _no_echo(
    chunks: AsyncGenerator[Chunk, None], echoed: str, engine: str
) -> AsyncGenerator[Chunk, None]:
    """`chunks`, failing an answer that only repeats the tool result `echoed` (normalized);
    its text is held while it could still become such an echo."""
    held: list[Delta] | None = []  # None: it can no longer be an echo
    async with aclosing(chunks) as inner:
        async for chunk in inner:
            if held is None:  # no echo any more: the rest as it comes
                yield chunk
            elif isinstance(chunk, Delta):
                held.append(chunk)
                if not echoed.startswith(_bare("".join(d.text for d in held))):
                    for piece in held:
                        yield piece
                    held = None
            elif isinstance(chunk, Finish) and _bare(text := "".join(d.text for d in held)):
                problem = "only the last tool result repeated, not an answer to it"
                raise InvalidOutputError(engine, "echo", text, problem)
            elif isinstance(chunk, Called | Finish):  # a call is no echo; nothing was said
                for piece in held:
                    yield piece
                held = None
                yield chunk
            else:  # marks, usage: not text
                yield chunk


def _answer(spec: ToolSpec, held: list[Delta], calls: int, engine: str) -> list[Delta]:
    """At the engine's finish: the held JSON answer, checked, as one piece; a required call
    that never came fails."""
    text = "".join(d.text for d in held)
    if spec.must_call and not calls:
        problem = "an answer without a tool call, where tool_choice requires one"
        raise InvalidOutputError(engine, "tool_call", text, problem)
    if not held or calls:
        return held  # no JSON answer held, or text beside a call (not the answer)
    check_answer(spec, text, engine=engine)
    return [Delta(text, held[-1].t)]


def _markup(held: list[Delta], engine: str) -> bool:
    """Whether the held start of an answer could still be a call written as text; one that
    is (`tools.written_call`) fails like an invalid call."""
    text = "".join(d.text for d in held)
    written = written_call(text)
    if written:
        problem = "a tool call written as text (template markup), not made as a call"
        raise InvalidOutputError(engine, "tool_call", text, problem)
    return written is None


def _sure(spec: ToolSpec, call: Called, engine: str) -> None:
    """A call below the spec's `min_call_confidence` is not delivered (the plan set the bound
    because another engine can answer instead)."""
    bound, confidence = spec.min_call_confidence, call.confidence
    if bound is not None and confidence is not None and confidence < bound:
        raise UnsureCallError(engine, f"{call.name}({call.arguments})", confidence, bound)


def _fits(request: GenerationRequest, spec: ToolSpec, call: Called, engine: str) -> None:
    """A call to a tool whose name the request states less than the spec's `min_tool_fit` is
    not delivered (the plan set the bound because another engine can answer instead)."""
    bound = spec.min_tool_fit
    if bound is None:
        return
    fit = tool_fit(question_of(request.messages), call.name)
    if fit < bound:
        raise UnfitCallError(engine, f"{call.name}({call.arguments})", fit, bound)
