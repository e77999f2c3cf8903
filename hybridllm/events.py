"""Typed events a stream hands to the app, and the chunks an engine hands to the orchestrator.

```
Event                 what the app sees through `Stream.events()`
├── Route             which engine serves the request, and why
├── DeadlineMissed    the first token came after the policy's first-token deadline (sent
│                     just before that first `Token`; `Trace.deadline_missed_ms`)
├── Token             one piece of answer text (never empty)
├── ToolCall          a complete tool call, checked against its tool's schema (`tools=`)
├── Fallback          another engine was started (deadline, failure, mid-stream failover)
│   ├── Hedge         ... started early by a hedge
│   └── ParallelStart ... started at once beside the primary, which is predicted to miss the
│                     deadline (a cloud started this way is a cloud request paid for)
├── Handoff           the answer moved from the local engine's fast start to the cloud, which
│                     continues it from the text delivered so far (the `handoff` plan)
├── CloudUnavailable  the cloud could not be used for a configuration reason (no API key, the
│                     key refused with 401/403); the request was served without it
├── Paused            the serving engine paused this answer for a more urgent request
│                     (preemption); it goes on where it stopped, nothing repeated
├── Draft             provisional local text of the speculative plan (only with show_drafts)
├── PartialJSON       a JSON answer's object so far, while it streams (provisional)
├── Retract           provisional text taken back: the end of the drafts the cloud rejected
│                     (show_drafts), or the partial JSON of an answer that failed its check
├── Usage             token counts as reported (or counted) by the engines, summed over
│                     every attempt, per engine (`EngineUsage`)
└── Done              the request finished; carries the final trace
```

Engine chunks are lower level: `Delta` (text), `Called` (a complete tool call: an engine
assembles a call before it hands it on, so a call is never split; the runtime checks it),
`Mark` (a timestamped phase such as "queued" or "first_byte"; `RequestSent`, the typed mark
"request_sent", says the request left for a billed endpoint, with the output-token bound it
carries (`TokenLimit`); `Resumed`, the typed mark "resumed", says a preempted answer goes on;
`Partial`, the typed mark "partial_json", a held JSON answer parsed so far),
`Finish` (reason and usage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from hybridllm.runtime.trace import Trace

# an engine's name: the app's own (`HybridClient(engines={"fast": ..., "smart": ...})`); "local"
# and "cloud" where the client was given `local=` and `cloud=`
EngineName = str
# a request's scheduling class on a busy engine (`Policy.priority`, per call `priority=`)
Priority = Literal["interactive", "normal", "background"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "normal", "background")
# why another engine was started (`Fallback.cause`, `Trace.fallback_cause`); `Fallback.reason`
# says the same in words, for people
FallbackCause = Literal[
    "deadline",  # no first token from the primary by the deadline (less the fallback's lead)
    "rescue",  # a quality decision's rescue started at once: it could not be ready if it waited
    "hedge",  # the hedge delay passed without a first token (`Hedge`)
    "parallel",  # started beside the primary: a predicted deadline miss (`ParallelStart`)
    "failed",  # the primary failed before its first token
    "refused",  # a guard refused the primary before its first token
    "mid_stream",  # the serving engine failed mid-stream: the other continues the answer
]


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event; `t` is `hybridllm.clock.now()` when the event was produced."""

    t: float


@dataclass(frozen=True, slots=True)
class Route(Event):
    engine: EngineName
    reason: str


@dataclass(frozen=True, slots=True)
class DeadlineMissed(Event):
    """The first token reached the app `late_ms` after the policy's first-token deadline
    (`deadline_ms`, from the `stream()` call), whichever plan and engine served it. Sent once,
    just before that first `Token`; `Trace.deadline_missed_ms` holds the same figure."""

    engine: EngineName
    deadline_ms: float
    late_ms: float


@dataclass(frozen=True, slots=True)
class Token(Event):
    text: str
    engine: EngineName


@dataclass(frozen=True, slots=True)
class ToolCall(Event):
    """A tool call the answer makes (`tools=`), complete and checked: `name` is a tool the
    request offered and `arguments` (JSON text, as OpenAI sends it) parse and match its
    parameters' schema. `id` pairs it with the `role: "tool"` message that answers it."""

    id: str
    name: str
    arguments: str
    engine: EngineName
    # the engine's own confidence in the call (the local model's probability of its name's and
    # arguments' tokens, `Called.confidence`); None: not measured (a cloud call)
    confidence: float | None = None

    def parsed(self) -> Any:
        """The arguments, parsed."""
        return json.loads(self.arguments or "{}")

    def message(self) -> dict[str, Any]:
        """The call as an entry of an assistant message's `tool_calls`."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class Fallback(Event):
    """Another engine was started: `cause` says why (to branch on), `reason` in words."""

    from_engine: EngineName
    to_engine: EngineName
    reason: str
    cause: FallbackCause = "failed"


@dataclass(frozen=True, slots=True)
class Hedge(Fallback):
    """The backup was started early by a hedge (not because the primary failed)."""

    cause: FallbackCause = "hedge"


@dataclass(frozen=True, slots=True)
class ParallelStart(Fallback):
    """`to_engine` (`engine`) was started at once, beside `from_engine`, because the routing
    decision predicts `from_engine` misses the first-token deadline; the first token wins.
    Sent right after the `Route`. Nothing failed: when it is the cloud, it is a cloud request
    paid for whichever engine wins (`Trace.parallel_start`, `Trace.spent`).

    A subclass of `Fallback`, like `Hedge`: `Fallback` means "another engine was started", so
    an app that watches `Fallback` to know a second engine is running keeps working, while
    `isinstance(event, ParallelStart)` tells a planned parallel start from a rescue."""

    cause: FallbackCause = "parallel"

    @property
    def engine(self) -> EngineName:
        """The engine started in parallel."""
        return self.to_engine


@dataclass(frozen=True, slots=True)
class Handoff(Event):
    """The cloud took the answer over from `from_engine` (the `handoff` plan): everything after
    the first `chars` characters (`tokens` content tokens of `from_engine`) comes from
    `to_engine`, which was asked to continue from exactly that text (`Trace.handoff`)."""

    from_engine: EngineName
    to_engine: EngineName
    chars: int
    tokens: int
    reason: str


@dataclass(frozen=True, slots=True)
class CloudUnavailable(Event):
    """The cloud engine is off for a configuration reason (`reason`, e.g. "authentication
    failed (401): check OPENAI_API_KEY or api_key="), so this request did not use it. Sent at
    most once per stream: after the `Route` when routing left the cloud out for it, or when the
    cloud refused this very request's key."""

    reason: str


@dataclass(frozen=True, slots=True)
class Paused(Event):
    """The local engine paused this answer after `delivered_tokens` tokens to serve a more
    urgent request (`reason`), and resumed it `resumed_after_ms` later from where it stopped,
    prefilling `prefill_tokens` again (the prompt and the delivered tokens, less any KV prefix
    still cached). Sent when the answer resumes; `Trace.pauses` keeps the same records."""

    engine: EngineName
    reason: str
    delivered_tokens: int
    resumed_after_ms: float
    prefill_tokens: int


@dataclass(frozen=True, slots=True)
class Draft(Event):
    """Provisional text the local model drafted, painted after everything shown so far (the
    speculative plan, with `show_drafts`). Not committed: the `Token` events that follow carry
    the committed text, which starts with whatever of the drafts was not retracted."""

    text: str


@dataclass(frozen=True, slots=True)
class Retract(Event):
    """Provisional text taken back (`text`): the last `n_chars` characters of the speculative
    plan's drafts the cloud rejected, or the raw text of the `PartialJSON` snapshots of an
    answer that failed its check (another engine answers instead)."""

    text: str

    @property
    def n_chars(self) -> int:
        return len(self.text)


@dataclass(frozen=True, slots=True)
class PartialJSON(Event):
    """A JSON answer's object so far, while it streams (`response_format` json_object or
    json_schema): `value` is parsed from the text that has come (its last string cut where the
    text is; a value not begun yet left out), a new one each time it grows. Not committed: the
    answer itself still arrives whole, checked, as one `Token` (and `Done.parsed`). Where that
    check fails and another engine answers instead, a `Retract` (its `text`: the raw text the
    snapshots came from) takes them back before the other engine's snapshots."""

    value: Any
    engine: EngineName


@dataclass(frozen=True, slots=True)
class EngineUsage:
    """What one engine did for a request, summed over its attempts (a retry, a fallback, a
    continuation, a loser cancelled in a race): the prompt and completion tokens it reported
    (or, where an attempt ended without a report, the content chunks counted: `estimated`), and
    how many of the tokens the app received it wrote (`delivered_tokens`)."""

    engine: EngineName
    prompt_tokens: int
    completion_tokens: int
    delivered_tokens: int = 0
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class Usage(Event):
    """Token counts over every attempt of the request (`by_engine`: per engine); `engine` is
    the one that finished the answer."""

    engine: EngineName
    prompt_tokens: int
    completion_tokens: int
    estimated: bool = False
    by_engine: tuple[EngineUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class Done(Event):
    """The end of the answer: why it finished, its trace, and for a JSON answer
    (`response_format` json_object / json_schema, no tool call) the validated object
    (`parsed`; None otherwise)."""

    finish_reason: str
    trace: Trace = field(repr=False)
    parsed: Any = None


# ---- engine chunks ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of generated text (may be empty for engines that emit empty deltas)."""

    text: str
    t: float


@dataclass(frozen=True, slots=True)
class Called:
    """A complete tool call an engine produced (the runtime checks it: `runtime.checked`).
    `confidence`: the engine's own confidence in it, from 0 to 1 (the local engine: the lower
    of the geometric means of its model's probabilities of the name's tokens and of the
    arguments' tokens, read from the logits before any grammar constrained them); None: not
    measured."""

    id: str
    name: str
    arguments: str
    t: float
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """A phase an engine can observe: queued, started, request_sent, first_byte, prefill_done."""

    name: str
    t: float


@dataclass(frozen=True, slots=True)
class TokenLimit:
    """The output-token bound a request was sent with: the field (`param`: "max_tokens" or
    "max_completion_tokens"), the value `sent`, and what the request `asked` (more than `sent`
    when the engine's context could not hold it)."""

    param: str
    sent: int
    asked: int


@dataclass(frozen=True, slots=True, init=False)
class RequestSent(Mark):
    """The mark "request_sent": the request is leaving for the endpoint, which may bill it from
    here on (the cloud guard settles a reservation, rather than releasing it, once it sees this,
    any text or a `Finish`). `limit`: the output-token bound it carries (None: not said);
    `continuation`: the dialect a continuation was asked in (`engines.continuation`: None, not
    a continuation)."""

    limit: TokenLimit | None
    continuation: str | None

    def __init__(
        self, t: float, *, limit: TokenLimit | None = None, continuation: str | None = None
    ) -> None:
        object.__setattr__(self, "name", "request_sent")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "continuation", continuation)


@dataclass(frozen=True, slots=True, init=False)
class Resumed(Mark):
    """The mark "resumed": the engine paused this answer at `paused_at` (after
    `delivered_tokens` tokens) for a more urgent request (`reason`) and goes on now, having
    prefilled `prefill_tokens` again. The stream turns it into a `Paused` event."""

    paused_at: float
    reason: str
    delivered_tokens: int
    prefill_tokens: int

    def __init__(
        self, t: float, *, paused_at: float, reason: str, delivered_tokens: int, prefill_tokens: int
    ) -> None:
        object.__setattr__(self, "name", "resumed")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "paused_at", paused_at)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "delivered_tokens", delivered_tokens)
        object.__setattr__(self, "prefill_tokens", prefill_tokens)


@dataclass(frozen=True, slots=True, init=False)
class CallOpened(Mark):
    """The mark "call_opened": a tool call's name is chosen (`call_name`) while its arguments
    are still being written; the call itself comes whole, as a `Called`, when they are. For the
    first-token deadline the answer has started here (a race crowns the engine that opened a
    call; `Trace.marks["call_opened"]`)."""

    call_name: str

    def __init__(self, t: float, *, call_name: str) -> None:
        object.__setattr__(self, "name", "call_opened")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "call_name", call_name)


@dataclass(frozen=True, slots=True, init=False)
class Partial(Mark):
    """The mark "partial_json": a held JSON answer's text so far (`text`) parsed into `value`
    (`runtime.checked`); the stream turns it into a `PartialJSON` event."""

    value: Any
    text: str

    def __init__(self, t: float, *, value: Any, text: str) -> None:
        object.__setattr__(self, "name", "partial_json")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "text", text)


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    t: float
    cached_prompt_tokens: int | None = None
    usage_estimated: bool = False


Chunk = Delta | Called | Mark | Finish


def is_content(chunk: Chunk) -> bool:
    """Whether `chunk` is part of the answer: text, a tool call, or a JSON answer's partial
    snapshot (the answer has begun, though it is delivered whole: a race is won by it, as by
    a first token)."""
    return isinstance(chunk, Called | Partial) or isinstance(chunk, Delta) and bool(chunk.text)
