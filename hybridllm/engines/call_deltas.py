"""Assemble OpenAI's streamed `delta.tool_calls` into complete calls.

A chat-completions stream sends a tool call in pieces, keyed by `index`: the first piece of an
index carries the call's `id` and `function.name`, the following pieces carry `function.arguments`
a few characters at a time. Several calls in one answer (parallel calls) have indexes 0, 1, ...:
OpenAI sends them one after the other; a server may interleave them. `CallAssembler` takes the
pieces as they come and hands back a `Called` only for a call that is whole:

- when a later index has started and the call's arguments parse as JSON (pieces of an earlier
  call may still come after a later one started, while its arguments are open); calls are handed
  back in index order, so a call never overtakes an earlier one;
- at the answer's finish (`finish()`), every call not handed back yet.

A malformed stream is a `CloudProtocolError` (what came so far: `received_content`): an index
without an `id` or a name by the time its call is whole, an id or name that changes within one
index, a piece for a call already handed back, arguments that never close (not JSON at the finish,
e.g. an answer cut by its token limit in the middle of a call). Whether the call names a tool the
request offered, with arguments its schema accepts, is the runtime's check (`runtime.checked`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridllm import clock
from hybridllm.errors import CloudProtocolError
from hybridllm.events import Called

__all__ = ["CallAssembler"]


@dataclass
class _Partial:
    """One call's pieces so far."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.arguments)

    def closed(self) -> bool:
        """Whether the arguments so far are a whole JSON value (no piece can extend one)."""
        text = self.text()
        if not text.strip():
            return False
        try:
            json.loads(text)
        except ValueError:
            return False
        return True


def _get(piece: object, name: str) -> Any:
    """A field of an SDK object or of a plain mapping (the SDK does not validate chunks)."""
    return piece.get(name) if isinstance(piece, Mapping) else getattr(piece, name, None)


def _text(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"tool call {what} is {type(value).__name__}, not a string")


class CallAssembler:
    """The tool calls of one streamed answer, assembled from their pieces (see the module)."""

    def __init__(self, endpoint: str = "the endpoint") -> None:
        self.endpoint = endpoint
        self._open: dict[int, _Partial] = {}
        self._next = 0  # the index of the next call to hand back
        self.handed = 0  # calls handed back
        self.received = False  # whether any piece came (content received)
        self.opened: list[str] = []  # the calls' names, each as its first piece named it

    @property
    def pending(self) -> int:
        """Calls begun and not handed back."""
        return len(self._open)

    def _error(self, problem: str) -> CloudProtocolError:
        return CloudProtocolError(
            f"malformed tool call from {self.endpoint}: {problem}", received_content=self.received
        )

    def add(self, piece: object) -> list[Called]:
        """Take one `delta.tool_calls` entry; the calls it makes whole, in index order."""
        index = _get(piece, "index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise self._error(f"a piece with index {index!r} (an int >= 0 is required)")
        self.received = True
        if index < self._next:
            raise self._error(f"a piece for call {index} after that call was complete")
        call = self._open.setdefault(index, _Partial(index))
        function = _get(piece, "function")
        call.id = self._same(call, "id", call.id, _text(_get(piece, "id"), "id"))
        name = arguments = None
        if function is not None:
            name = _text(_get(function, "name"), "name")
            arguments = _text(_get(function, "arguments"), "arguments")
        named = call.name is None
        call.name = self._same(call, "name", call.name, name)
        if named and call.name is not None:
            self.opened.append(call.name)
        if arguments:
            call.arguments.append(arguments)
        return self._ready()

    def _same(self, call: _Partial, what: str, held: str | None, new: str | None) -> str | None:
        """`new` where nothing was held (a server may repeat a field; it may not change it)."""
        if not new or new == held:
            return held
        if held is not None:
            raise self._error(f"call {call.index} changed its {what} from {held!r} to {new!r}")
        return new

    def _ready(self) -> list[Called]:
        """The calls a later index has closed, in index order."""
        out: list[Called] = []
        while (call := self._open.get(self._next)) is not None:
            later = any(i > call.index for i in self._open)
            if not (later and call.closed()):
                break
            out.append(self._whole(call))
        return out

    def finish(self, reason: str | None = None) -> list[Called]:
        """At the answer's finish: every call not handed back yet, each whole or an error."""
        out: list[Called] = []
        for index in sorted(self._open):
            call = self._open[index]
            if index != self._next:
                raise self._error(f"call {self._next} never came, call {index} did")
            if call.text().strip() and not call.closed():
                cut = f" (finish reason {reason!r})" if reason else ""
                raise self._error(f"the arguments of call {index} never closed{cut}")
            out.append(self._whole(call))
        return out

    def _whole(self, call: _Partial) -> Called:
        """`call`, handed back: its id and name are required."""
        if not call.id:
            raise self._error(f"call {call.index} came without an id")
        if not call.name:
            raise self._error(f"call {call.index} came without a function name")
        del self._open[call.index]
        self._next = call.index + 1
        self.handed += 1
        return Called(call.id, call.name, call.text() if call.text().strip() else "{}", clock.now())
