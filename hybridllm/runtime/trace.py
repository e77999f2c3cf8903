"""The figures of one request, measured at the client.

All times come from `hybridllm.clock.now()` (the event loop's clock). TTFT runs from the
`stream()` call to the first token that carries content; role-only chunks, keep-alives and
empty deltas never count.

Money: every cloud request of this request that the cloud guard's ledger settled (a guard with
`prices=`) is in `spent`, with the role it played (`SpendRole`: the plan that starts an engine
sets `spend_role` in that engine's task, and the guard's settle hook, `Trace.settled`, reads
it); `cost_usd` is their sum. A cloud started in parallel that lost the race is in there too,
with what the guard settled for it (a cancelled stream is billed for its prompt and the tokens
counted so far; one never sent is released and costs nothing).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from hybridllm import clock
from hybridllm.events import EngineName, EngineUsage, FallbackCause, TokenLimit
from hybridllm.runtime.records import (
    Attempt,
    AttemptOutcome,
    CascadeDecision,
    CascadeRecord,
    FallbackRecord,
    HandoffOutcome,
    HandoffRecord,
    Pause,
    SeamRecord,
    Speculation,
    Spend,
    SpendRole,
    Switch,
    TextSpan,
    Unverified,
    spend_role,
)
from hybridllm.runtime.trace_export import nearest_rank, trace_dict
from hybridllm.runtime.trace_import import trace_fields

if TYPE_CHECKING:
    from hybridllm.policy import PlanName
    from hybridllm.routing.decision import Decision, Objective, ReasonCode

__all__ = [  # the records are `runtime.records`'; they are named here too, where they were
    "Attempt",
    "AttemptOutcome",
    "CascadeDecision",
    "CascadeRecord",
    "FallbackRecord",
    "HandoffOutcome",
    "HandoffRecord",
    "Pause",
    "Spend",
    "SpendRole",
    "Speculation",
    "Switch",
    "TextSpan",
    "Trace",
    "Unverified",
    "spend_role",
]


@dataclass(frozen=True, slots=True)
class Trace:
    """A request's record, as a value: `runtime.recorder.Recorder` alone writes it, and hands it
    out frozen when the request ends (every sequence a tuple). Build one for a test or a logged
    row with keywords, or with `from_dict`."""

    t_start: float = field(default_factory=clock.now)
    wall_start: float = field(default_factory=time.time)  # the call, in seconds since the epoch
    # names this request in the decision log (`HybridClient.feedback(trace.request_id, good)`)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    engine: EngineName | None = None  # the engine serving the answer (at the end: that wrote it)
    policy: str | None = None  # the policy's name (None: refused before one was chosen)
    plan: PlanName | None = None  # the plan that ran ("single", "hedge", "cascade", ...)
    objective: Objective | None = None  # what the decision optimised (`Decision.objective`)
    route_reason: str = ""  # the `Route` event's words (the plan's, for people)
    decision: Decision | None = None  # the routing decision, typed (None: not decided)
    predicted_ttft_ms: Mapping[str, float] = field(default_factory=dict)  # per engine, at the call
    # how late the first token came after the policy's first-token deadline (a `DeadlineMissed`
    # event); None: on time, no deadline, or no token
    deadline_missed_ms: float | None = None
    # the output-token bound the serving engine's request carried (the engine said it: the cloud)
    token_limit: TokenLimit | None = None
    # the dialect a cloud continuation of the delivered text was asked in ("continue_final_
    # message", "trailing_assistant", "raw_completion", "instruction": `engines.continuation`);
    # None: none sent
    continuation: str | None = None
    # every other engine started, in order, with why (`Fallback` events: one record each; a
    # parallel start is the one whose cause is "parallel")
    fallbacks: Sequence[FallbackRecord] = ()
    # the cascade plan: its decision, held time and the local signals (plans/cascade.py)
    cascade: CascadeRecord | None = None
    spent: Sequence[Spend] = ()  # settled cloud requests, in order
    started: Sequence[EngineName] = ()  # engines that ran, in order
    # the client's engine on the device, by name (None: it had none): every other is a cloud
    device: EngineName | None = "local"
    retries: int = 0  # retried attempts before the first token
    # mid-stream switches to the other engine, in order (each has its fallback record too)
    switches: Sequence[Switch] = ()
    # preemption on the device: each pause and resume (a move to the cloud is a switch above)
    pauses: Sequence[Pause] = ()
    # each continuation's seam, judged before delivery (`runtime.seam`): what was cut
    seams: Sequence[SeamRecord] = ()
    handoff: HandoffRecord | None = None  # the handoff plan: where the cloud took over
    # engines a guard kept the request from, with why ("cloud: privacy: ...", "cloud: budget: ...")
    refusals: Sequence[str] = ()
    finish_reason: str | None = None
    # the error that ended the request: its type (to branch on, `issubclass(...)`), and its text
    # ("CloudConnectionError: connection reset") for people to read; None when it completed
    error_type: type[Exception] | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    # the oldest messages left out so the conversation fits the local context (`[sampling]
    # overflow = "trim"`, `runtime.trim`); 0: the prompt went as given
    trimmed_messages: int = 0
    completion_tokens: int | None = None
    usage_estimated: bool = False
    cached_prompt_tokens: int | None = None
    # content tokens (and tool calls) as produced: when the serving engine's stream yielded
    # them (the llama thread's stamp for the local engine, the SSE chunk's arrival for the cloud)
    token_times: Sequence[float] = field(default=(), repr=False)
    # ... and when each was handed to the app (put on its stream, on the event loop, which
    # resumes the app's waiting iteration next): TTFT, ITL and TPOT are measured at this
    # delivery; the gap from production is the hop (`hop_ms`). An app that reads late is not
    # counted: the time is when the token was there for it
    delivered_times: Sequence[float] = field(default=(), repr=False)
    spans: Sequence[TextSpan] = ()  # which engine wrote which tokens
    attempts: Sequence[Attempt] = ()  # every engine stream started
    # tokens engines spent outside an engine stream (`RequestRun.counted`): in the usage
    counted: Sequence[EngineUsage] = ()
    tool_calls: Sequence[str] = ()  # names of the tool calls delivered
    marks: Mapping[str, float] = field(default_factory=dict)
    t_done: float | None = None
    speculation: Speculation | None = None  # the speculative plan's figures (None: not run)
    # the prompt, the answer and the tool calls' arguments, kept only where the client captures
    # content (`HybridClient(capture_content=...)`); None: not captured
    content: Mapping[str, Any] | None = field(default=None, repr=False)

    def frozen(self) -> Trace:
        """This trace with every sequence a tuple, every mapping and plan record a copy: a value
        that no later write (a plan still holding its records) reaches."""
        changes: dict[str, Any] = {
            f.name: tuple(getattr(self, f.name)) for f in fields(self) if f.name in _SEQS
        }
        changes["attempts"] = tuple(copy.deepcopy(a) for a in self.attempts)
        changes |= {name: dict(getattr(self, name)) for name in ("predicted_ttft_ms", "marks")}
        changes |= {name: copy.deepcopy(getattr(self, name)) for name in _PLAN_RECORDS}
        return replace(self, **changes)

    @property
    def reasons(self) -> tuple[str, ...]:
        """The routing decision's reasons in words, for people, in order."""
        return () if self.decision is None else tuple(r.text for r in self.decision.reasons)

    @property
    def reason_codes(self) -> tuple[ReasonCode, ...]:
        """The routing decision's reasons as codes (to branch on), in order."""
        return () if self.decision is None else self.decision.codes

    @property
    def fallback_cause(self) -> FallbackCause | None:
        """Why another engine first started (`fallbacks[0].cause`); None: none did."""
        return self.fallbacks[0].cause if self.fallbacks else None

    @property
    def fallback_reason(self) -> str | None:
        """`fallback_cause` in words, for people."""
        return self.fallbacks[0].reason if self.fallbacks else None

    @property
    def hedged(self) -> bool:
        """The backup was started by a hedge."""
        return self.fallback_cause == "hedge"

    @property
    def fell_back(self) -> bool:
        """Another engine was started (for any cause: what `stats()` counts as a fallback)."""
        return bool(self.fallbacks)

    @property
    def _parallel(self) -> FallbackRecord | None:
        return next((f for f in self.fallbacks if f.cause == "parallel"), None)

    @property
    def parallel_engine(self) -> EngineName | None:
        """The engine started at once beside the primary (a `ParallelStart`); None: none."""
        found = self._parallel
        return None if found is None else found.to_engine

    @property
    def parallel_start(self) -> str | None:
        """Why that engine started at once, in words; None: no parallel start."""
        found = self._parallel
        return None if found is None else found.reason

    def usage_by_engine(self) -> list[EngineUsage]:
        """Each engine's tokens, summed over its attempts (`Attempt.usage`) and the work counted
        outside them (`counted`), with the tokens of the answer it wrote."""
        sums: dict[EngineName, list[int]] = {}
        estimated: dict[EngineName, bool] = {}
        rows: list[tuple[EngineName, tuple[int | None, int, bool]]] = [
            (a.engine, a.usage()) for a in self.attempts
        ]
        rows += [
            (u.engine, (u.prompt_tokens, u.completion_tokens, u.estimated)) for u in self.counted
        ]
        for engine, (prompt, completion, est) in rows:
            acc = sums.setdefault(engine, [0, 0])
            acc[0], acc[1] = acc[0] + (prompt or 0), acc[1] + completion
            estimated[engine] = estimated.get(engine, False) or est
        delivered = self.delivered_by_engine()
        for engine in delivered:
            sums.setdefault(engine, [0, 0])
        return [
            _engine_usage(e, p, c, delivered.get(e, 0), estimated.get(e, False))
            for e, (p, c) in sums.items()
        ]

    def delivered_by_engine(self) -> dict[EngineName, int]:
        """How many of the content tokens handed to the app each engine wrote (`spans`)."""
        out: dict[EngineName, int] = {}
        for i, span in enumerate(self.spans):
            end = self.spans[i + 1].first if i + 1 < len(self.spans) else self.n_tokens
            out[span.engine] = out.get(span.engine, 0) + end - span.first
        return out

    # ---- figures --------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Content tokens (and tool calls) handed to the app (deltas carrying text)."""
        return len(self.token_times)

    @property
    def times(self) -> Sequence[float]:
        """The content tokens' times at delivery to the app."""
        return self.delivered_times

    @property
    def ttft_ms(self) -> float | None:
        """From the `stream()` call to the first content token's delivery to the app."""
        tt = self.times
        return None if not tt else (tt[0] - self.t_start) * 1000.0

    @property
    def produced_ttft_ms(self) -> float | None:
        """From the call to the serving engine producing the first content token."""
        tt = self.token_times
        return None if not tt else (tt[0] - self.t_start) * 1000.0

    @property
    def itl_ms(self) -> list[float]:
        """Inter-token gaps at delivery in milliseconds, in order."""
        return _gaps_ms(self.times)

    @property
    def itl_p99_ms(self) -> float | None:
        return _p99(self.itl_ms)

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first (decode speed as the app felt it)."""
        tt = self.times
        if len(tt) < 2:
            return None
        return (tt[-1] - tt[0]) * 1000.0 / (len(tt) - 1)

    @property
    def produced_tpot_ms(self) -> float | None:
        """`tpot_ms` from the production times (the serving engines' own decode speed)."""
        tt = self.token_times
        return None if len(tt) < 2 else (tt[-1] - tt[0]) * 1000.0 / (len(tt) - 1)

    @property
    def hop_ms(self) -> list[float]:
        """For each token the app received: from its production to its delivery (the hop from
        the engine's thread or socket, through the orchestrator, to the app)."""
        pairs = zip(self.token_times, self.delivered_times, strict=False)
        return [(d - p) * 1000.0 for p, d in pairs]

    def span_itl_ms(self) -> list[tuple[EngineName, list[float]]]:
        """The delivered gaps of each span of text, with its engine (a gap across a seam goes
        with the span after it)."""
        tt, out = self.times, []
        for i, span in enumerate(self.spans):
            end = self.spans[i + 1].first if i + 1 < len(self.spans) else len(tt)
            out.append((span.engine, _gaps_ms(tt[max(span.first - 1, 0) : end])))
        return out

    @property
    def total_ms(self) -> float | None:
        return None if self.t_done is None else (self.t_done - self.t_start) * 1000.0

    @property
    def segments_ms(self) -> dict[str, float]:
        """Each observed phase as milliseconds since the `stream()` call."""
        return {k: (v - self.t_start) * 1000.0 for k, v in sorted(self.marks.items(), key=_by_t)}

    @property
    def cost_usd(self) -> float | None:
        """What this request's cloud requests cost, as the guard's ledger settled them; None:
        none was settled (no cloud request billed, or a client without prices= to cost one)."""
        return sum(s.usd for s in self.spent) if self.spent else None

    @property
    def overrun_usd(self) -> float:
        """What this request's cloud requests were billed above their reservations (0.0: each
        kept to its bound; above 0: the ledger has closed the caps they were under)."""
        return sum(s.overrun_usd for s in self.spent)

    def on_cloud(self, engine: EngineName | None) -> bool:
        """Is `engine` (a name in this trace) a cloud, not the device's?"""
        return engine is not None and engine != self.device

    @property
    def cloud_cancelled(self) -> bool:
        """A cloud request of this request started and was cancelled before it served a token:
        another engine won the race (a parallel start, a hedge, a rescue). It is a cost: the
        guard bills its prompt (`spent`, under its role), and `Policy.parallel_cloud_share`
        counts it."""
        if not any(map(self.on_cloud, self.started)) or self.engine is None:
            return False
        served = {self.engine, *(s.engine for s in self.spans)}
        if not any(e not in served for e in self.started if self.on_cloud(e)):
            return False  # every cloud started served some of the answer
        if self.handoff is not None or self.speculation is not None:
            return False  # the cloud's work there is the plan's own (its records say what)
        switched = {e for s in self.switches for e in (s.from_engine, s.to_engine)}
        return not any(self.on_cloud(e) for e in switched)

    @property
    def parallel_cost_usd(self) -> float | None:
        """What the cloud started in parallel cost (None: none settled)."""
        mine = [s.usd for s in self.spent if s.role == "parallel"]
        return sum(mine) if mine else None

    @property
    def tokens_per_s(self) -> float | None:
        tpot = self.tpot_ms
        return None if not tpot else 1000.0 / tpot

    def to_dict(self) -> dict[str, Any]:
        """Every figure of this request as JSON-ready data (`runtime.trace_export`): times in
        milliseconds since the call; no prompt or answer text unless captured."""
        return trace_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trace:
        """The trace `data` (a `to_dict()`, say a decision log's row) describes, its clock
        starting at 0 (`runtime.trace_import`): `from_dict(d).to_dict()` gives `d` again."""
        return cls(**trace_fields(data)).frozen()

    def to_json(self, **kwargs: Any) -> str:
        """`to_dict()` as JSON text (`kwargs` go to `json.dumps`, e.g. `indent=2`)."""
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "ttft_ms": _r(self.ttft_ms),
            "tpot_ms": _r(self.tpot_ms),
            "tokens": self.n_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_ms": _r(self.total_ms),
            "finish_reason": self.finish_reason,
            "parallel_start": self.parallel_engine,
            "cloud_cancelled": self.cloud_cancelled,
            "cost_usd": self.cost_usd,
        }


# the trace's fields that are sequences (tuples in the frozen value)
_SEQS = frozenset(
    {
        "fallbacks",
        "spent",
        "started",
        "switches",
        "pauses",
        "refusals",
        "token_times",
        "delivered_times",
        "spans",
        "attempts",
        "counted",
        "tool_calls",
    }
)


# the plans' own records (mutable while their plan runs; copied into the frozen value)
_PLAN_RECORDS = ("cascade", "handoff", "speculation", "content")


def _gaps_ms(tt: Sequence[float]) -> list[float]:
    return [(b - a) * 1000.0 for a, b in zip(tt, tt[1:], strict=False)]


def _p99(values: list[float]) -> float | None:
    """The nearest-rank 99th percentile (None: no values)."""
    return nearest_rank(sorted(values), 0.99) if values else None


def _by_t(item: tuple[str, float]) -> float:
    return item[1]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _engine_usage(
    engine: EngineName, prompt: int, completion: int, delivered: int, estimated: bool
) -> EngineUsage:
    """One engine's usage: its report where it reported (the delivered count is of text
    chunks, which may outnumber tokens: a held-back tail flushed at the end), else the count,
    at least the chunks delivered."""
    counted = completion if not estimated else max(completion, delivered)
    return EngineUsage(engine, prompt, counted, delivered, estimated)
