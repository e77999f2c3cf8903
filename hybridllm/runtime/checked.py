"""What an engine produced, checked against the request's tools and response format before any
of it reaches a plan (every plan streams through `RequestRun.relay`, which wraps each engine
stream in `checked`): one home for the rule that an invalid tool call or JSON answer is never
delivered.

- A tool call (`Called`) passes only when `hybridllm.tools.check_call` accepts it: a tool the
  request lets the answer call, with arguments that parse and match its schema.
- With a JSON response format, the answer's text is held until the engine finishes, checked
  whole (`check_answer`) and handed on as one piece: a JSON answer is atomic, like a call.
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

A failure is an `InvalidOutputError` raised before anything of the answer left the engine's
stream (text streamed before a call excepted): the plan treats it as the engine failing, so the
request escalates to the other engine where the policy allows, or the error reaches the app.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import InvalidOutputError, UnfitCallError, UnsureCallError
from hybridllm.events import Called, Chunk, Delta, Finish
from hybridllm.tools import ToolSpec, check_answer, check_call, written_call
from hybridllm.tools.fit import question_of, tool_fit

__all__ = ["checked"]


async def checked(
    chunks: AsyncGenerator[Chunk, None], request: GenerationRequest, engine: str
) -> AsyncGenerator[Chunk, None]:
    """`chunks`, with every tool call and JSON answer checked (the stream is always closed)."""
    spec = request.tools
    async with aclosing(chunks) as inner:
        if spec is None:
            async for chunk in inner:
                yield chunk
            return
        hold = spec.response_format is not None or spec.must_call
        held: list[Delta] = []  # a JSON answer's text until it is whole; text before a call
        # an answer that may call: its first text is held while it could be call markup
        sniff = spec.may_call and not hold
        calls = 0
        async for chunk in inner:
            if isinstance(chunk, Called):
                check_call(spec, chunk.name, chunk.arguments, engine=engine)
                # the bounds judge the local engine's first call: once a call is delivered,
                # the answer cannot move any more
                if not calls and engine == "local":
                    _sure(spec, chunk, engine)
                    _fits(request, spec, chunk, engine)
                calls, sniff = calls + 1, False
                for piece in held:  # text beside a call: not the answer, delivered with it
                    yield piece
                held.clear()
                yield chunk
            elif isinstance(chunk, Delta) and hold:
                held.append(chunk)
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
