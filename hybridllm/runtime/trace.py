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

import json
import time
import uuid
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hybridllm import clock
from hybridllm.events import EngineName, EngineUsage, FallbackCause, Finish, TokenLimit
from hybridllm.runtime.trace_export import nearest_rank, trace_dict

if TYPE_CHECKING:
    from hybridllm.guard.budget import TokenUsage
    from hybridllm.routing.decision import Decision, ReasonCode

# what a cloud request did for its request: served it from the start ("primary"), started at
# the deadline or on a failure ("fallback"), by a hedge ("hedge"), at once beside the primary
# ("parallel"), continued a started answer ("continuation"), took a local start over ("handoff")
# or verified a local draft ("verification", the speculative plan; "probe": its fixed requests
# that find the endpoint's verification dialect, once per endpoint)
SpendRole = Literal[
    "primary",
    "fallback",
    "hedge",
    "parallel",
    "continuation",
    "handoff",
    "verification",
    "probe",
]
spend_role: ContextVar[SpendRole] = ContextVar("hybridllm_spend_role", default="primary")


@dataclass(frozen=True, slots=True)
class Spend:
    """One settled cloud request: its role, tokens and cost (`estimated`: counted by the
    client, the server reported no usage)."""

    role: SpendRole
    prompt_tokens: int
    completion_tokens: int
    usd: float
    estimated: bool = False
    # billed above the guard's reservation, the request's bound (the ledger closes its caps)
    overrun_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class Pause:
    """The local engine paused the answer for a more urgent request (preemption) and went on
    later: when (`hybridllm.clock.now()` times), why, the tokens generated before, and the tokens it
    prefilled again to resume (the prompt and those tokens, less the cached prefix)."""

    paused_at: float
    resumed_at: float
    reason: str
    delivered_tokens: int
    prefill_tokens: int

    @property
    def ms(self) -> float:
        return (self.resumed_at - self.paused_at) * 1000.0


# what became of a handoff: the cloud was asked (after `after_tokens`, at the local deadline, or
# because the local engine failed) and then took the answer ("switched"), failed before its first
# token, or was too slow (the local engine resumed from the seam in both)
HandoffOutcome = Literal[
    "asked",
    "asked_at_deadline",
    "asked_after_local_failed",
    "switched",
    "cloud_failed",
    "cloud_too_slow",
]


@dataclass
class HandoffRecord:
    """Where a `handoff` plan moved the answer (times are `hybridllm.clock.now()`)."""

    asked_t: float  # the cloud was asked to continue from the text delivered then
    local_chars: int  # ... that many characters, all from the local engine: the seam
    local_tokens: int  # the local engine's content tokens in them
    switched_t: float | None = None  # the cloud's first token: the answer moved there
    outcome: HandoffOutcome = "asked"  # what became of the handoff (to branch on)
    detail: str = ""  # ... and why, in words for people (a failure's text, a timer's)


@dataclass(frozen=True, slots=True)
class Switch:
    """The answer moved mid-stream to the other engine, which continued from the delivered text
    (a failover, a stall, a preemption on the device, a failed verification): when
    (`clock.now()`), from and to which engine, why (words for people), the characters
    delivered before the seam, and the class of the error that caused it (to branch on)."""

    at: float
    from_engine: EngineName
    to_engine: EngineName
    reason: str
    delivered_chars: int
    error_type: type[BaseException] | None = None


@dataclass(frozen=True, slots=True)
class FallbackRecord:
    """Another engine was started (the trace's side of a `Fallback` event, written by the same
    call: `RequestRun.fell_back`): when, from and to which engine, why (`cause`, to branch on;
    `reason`, words for people)."""

    at: float
    from_engine: EngineName
    to_engine: EngineName
    cause: FallbackCause
    reason: str


AttemptOutcome = Literal["running", "finished", "failed", "cancelled"]


@dataclass(slots=True)
class Attempt:
    """One engine stream this request started (`RequestRun.relay`: a primary, a hedge, a
    fallback, a parallel start, a continuation or a handoff; the speculative plan adds its
    verification rounds): the engine and its model, the part it played (`role`, as for money),
    when it started, produced its first content and ended (`hybridllm.clock.now()` times), how
    it ended, the class of the error that ended it, and the content chunks it produced (held
    ones included: a rescue that never served still shows what it made)."""

    engine: EngineName
    model: str
    role: SpendRole
    t_start: float
    t_first: float | None = None
    t_end: float | None = None
    outcome: AttemptOutcome = "running"
    error_type: type[BaseException] | None = None
    tokens: int = 0
    attempt: int = 1  # 2, 3, ...: a retry of the same stream (`RetryPolicy`)
    # the engine's own report at its end (None: it ended without one, failed or cancelled)
    finish: Finish | None = None

    def usage(self) -> tuple[int | None, int, bool]:
        """(prompt, completion, estimated): the engine's report, else the content counted (the
        prompt None: not reported)."""
        f = self.finish
        if f is None:
            return None, self.tokens, self.tokens > 0
        completion = self.tokens if f.completion_tokens is None else f.completion_tokens
        return f.prompt_tokens, completion, f.usage_estimated or f.completion_tokens is None

    def content(self, t: float) -> None:
        if self.t_first is None:
            self.t_first = t
        self.tokens += 1

    def ended(self, outcome: AttemptOutcome, t: float, exc: BaseException | None = None) -> None:
        self.outcome, self.t_end = outcome, t
        self.error_type = None if exc is None else type(exc)


@dataclass(frozen=True, slots=True)
class TextSpan:
    """A run of delivered content from one engine: it starts at delivered token `first` (an
    index into `Trace.token_times`) and goes on to the next span's start or the end."""

    engine: EngineName
    first: int


CascadeDecision = Literal["local", "cloud", "race"]


@dataclass
class CascadeRecord:
    """What the cascade plan did, filled in as it runs (`plans/cascade.py`): the router's stage-1
    score of the prompt (`text`), whether the cloud started at once (`hedged`), the cut and the
    judge; then the time the local start was held, the decision, and, when it was scored, the
    combined score (`value`), the stage-2 model, the local model's own confidence (`local`),
    the signals read and their cost, and the characters held; for a whole-answer judgement the
    whole answer's figures (`answer_signals`) and its tokens; why a released local answer failed
    over to the cloud (`failover`). None: not reached."""

    text: float
    hedged: bool
    cut: float
    judge: Literal["prefix", "answer"]
    held_ms: float | None = None
    decision: CascadeDecision | None = None
    value: float | None = None
    model: str | None = None
    local: float | None = None
    signals: dict[str, float | None] | None = None
    cost_ms: float | None = None
    held_chars: int | None = None
    answer_signals: dict[str, float | None] | None = None
    local_tokens: int | None = None
    failover: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields that were reached, JSON-ready (the decision log stores them)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# why a speculative request verified no draft: sampling over the whole vocabulary (temperature
# > 0, top_p = 1), a local engine that cannot draft, a cloud that cannot verify, the guard
# refused the probe, the endpoint speaks no verification dialect, or temperature > 0 needs raw
# token-level log-probabilities it does not give
Unverified = Literal[
    "whole_vocabulary",
    "cannot_draft",
    "cannot_verify",
    "probe_refused",
    "no_dialect",
    "needs_raw_logprobs",
]


@dataclass
class Speculation:
    """What the speculative plan did: the verifier dialect (or why none), rounds, tokens
    drafted and accepted, k and the verification time per round, and whether (and after how
    many committed characters, and why) it switched to plain cloud streaming."""

    verifier: str = ""  # the dialect, or "none: ..." (words for people: `unverified` is typed)
    unverified: Unverified | None = None  # why no draft could be verified (None: it could)
    rule: str = ""  # the acceptance rule that ran (greedy top-1, or speculative sampling)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    k: list[int] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    switched: str | None = None  # why it switched to plain streaming (None: it did not)
    switched_at: int | None = None  # committed characters before the switch
    near_ties: int = 0  # rounds whose cloud token was chosen at a top-2 gap under 0.05 nats
    ahead_used: int = 0  # rounds whose draft was made while the previous one was verified

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class Trace:
    t_start: float = field(default_factory=clock.now)
    wall_start: float = field(default_factory=time.time)  # the call, in seconds since the epoch
    # names this request in the decision log (`HybridClient.feedback(trace.request_id, good)`)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    engine: EngineName | None = None
    policy: str | None = None  # the policy's name (None: refused before one was chosen)
    plan: str | None = None  # the plan that ran ("single", "race", "cascade", ...)
    objective: str | None = None  # what the decision optimised (`Decision.objective`)
    route_reason: str = ""
    decision: Decision | None = None  # the routing decision, typed (None: not decided)
    predicted_ttft_ms: dict[str, float] = field(default_factory=dict)  # per engine, at the call
    # how late the first token came after the policy's first-token deadline (a `DeadlineMissed`
    # event); None: on time, no deadline, or no token
    deadline_missed_ms: float | None = None
    # the output-token bound the serving engine's request carried (the engine said it: the cloud)
    token_limit: TokenLimit | None = None
    # every other engine started, in order, with why (`Fallback` events: one record each)
    fallbacks: list[FallbackRecord] = field(default_factory=list)
    # why the other engine started at once beside the primary (a predicted deadline miss; a
    # `ParallelStart` event), and which one; None: no parallel start
    parallel_start: str | None = None
    parallel_engine: EngineName | None = None
    # the cascade plan: its decision, held time and the local signals (plans/cascade.py)
    cascade: CascadeRecord | None = None
    spent: list[Spend] = field(default_factory=list)  # settled cloud requests, in order
    started: list[EngineName] = field(default_factory=list)  # engines that ran, in order
    retries: int = 0  # retried attempts before the first token
    # mid-stream switches to the other engine, in order (`switched()` records one)
    switches: list[Switch] = field(default_factory=list)
    # preemption on the device: each pause and resume (a move to the cloud is a switch above)
    pauses: list[Pause] = field(default_factory=list)
    handoff: HandoffRecord | None = None  # the handoff plan: where the cloud took over
    # engines a guard kept the request from, with why ("cloud: privacy: ...", "cloud: budget: ...")
    refusals: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    # the error that ended the request: its type (to branch on, `issubclass(...)`), and its text
    # ("CloudConnectionError: connection reset") for people to read; None when it completed
    error_type: type[Exception] | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_estimated: bool = False
    cached_prompt_tokens: int | None = None
    # content tokens (and tool calls) as produced: when the serving engine's stream yielded
    # them (the llama thread's stamp for the local engine, the SSE chunk's arrival for the cloud)
    token_times: list[float] = field(default_factory=list, repr=False)
    # ... and when each was handed to the app (put on its stream, on the event loop, which
    # resumes the app's waiting iteration next): TTFT, ITL and TPOT are measured at this
    # delivery; the gap from production is the hop (`hop_ms`). An app that reads late is not
    # counted: the time is when the token was there for it
    delivered_times: list[float] = field(default_factory=list, repr=False)
    spans: list[TextSpan] = field(default_factory=list)  # which engine wrote which tokens
    attempts: list[Attempt] = field(default_factory=list)  # every engine stream started
    # tokens engines spent outside an engine stream (`RequestRun.counted`): in the usage
    counted: list[EngineUsage] = field(default_factory=list)
    tool_calls: list[str] = field(default_factory=list)  # names of the tool calls delivered
    marks: dict[str, float] = field(default_factory=dict)
    t_done: float | None = None
    speculation: Speculation | None = None  # the speculative plan's figures (None: not run)
    # the prompt, the answer and the tool calls' arguments, kept only where the client captures
    # content (`HybridClient(capture_content=...)`); None: not captured
    content: dict[str, Any] | None = field(default=None, repr=False)

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
            EngineUsage(
                e, p, max(c, delivered.get(e, 0)), delivered.get(e, 0), estimated.get(e, False)
            )
            for e, (p, c) in sums.items()
        ]

    def delivered_by_engine(self) -> dict[EngineName, int]:
        """How many of the content tokens handed to the app each engine wrote (`spans`)."""
        out: dict[EngineName, int] = {}
        for i, span in enumerate(self.spans):
            end = self.spans[i + 1].first if i + 1 < len(self.spans) else self.n_tokens
            out[span.engine] = out.get(span.engine, 0) + end - span.first
        return out

    # ---- recording (used by the orchestrator) -------------------------------------------

    def mark(self, name: str, t: float | None = None) -> None:
        """Record the first time a phase was seen (later repeats are ignored)."""
        self.marks.setdefault(name, clock.now() if t is None else t)

    def settled(self, usage: TokenUsage, usd: float, overrun_usd: float = 0.0) -> None:
        """The cloud guard settled one of this request's cloud requests (its settle hook); the
        role comes from the task it ran in (`spend_role`)."""
        self.spent.append(
            Spend(
                spend_role.get(),
                usage.prompt_tokens,
                usage.completion_tokens,
                usd,
                usage.estimated,
                overrun_usd,
            )
        )

    def switched(
        self,
        from_engine: EngineName,
        to_engine: EngineName,
        exc: BaseException,
        delivered_chars: int,
        *,
        reason: str | None = None,
        t: float | None = None,
    ) -> Switch:
        """Record a mid-stream switch caused by `exc` (`reason`: its text unless given)."""
        at = clock.now() if t is None else t
        why = str(exc) if reason is None else reason
        switch = Switch(at, from_engine, to_engine, why, delivered_chars, type(exc))
        self.switches.append(switch)
        return switch

    def token(
        self, t: float, engine: EngineName | None = None, delivered: float | None = None
    ) -> None:
        """A content token (or tool call) produced at `t` by `engine` was handed to the app at
        `delivered` (put on its stream: the app's waiting iteration is resumed next; None: at
        `t`)."""
        if not self.token_times:
            self.mark("first_token", t)
        if engine is not None and (not self.spans or self.spans[-1].engine != engine):
            self.spans.append(TextSpan(engine, len(self.token_times)))
        self.token_times.append(t)
        self.delivered_times.append(t if delivered is None else delivered)

    def attempt(self, engine: EngineName, model: str, role: SpendRole, n: int = 1) -> Attempt:
        """Record that an engine stream starts now (`Attempt.ended` closes it)."""
        record = Attempt(engine, model, role, clock.now(), attempt=n)
        self.attempts.append(record)
        return record

    def done(self, finish_reason: str, t: float | None = None) -> None:
        self.finish_reason = finish_reason
        self.t_done = clock.now() if t is None else t
        self.mark("done", self.t_done)

    # ---- figures --------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Content tokens (and tool calls) handed to the app (deltas carrying text)."""
        return len(self.token_times)

    @property
    def times(self) -> list[float]:
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

    @property
    def cloud_cancelled(self) -> bool:
        """A cloud request of this request started and was cancelled before it served a token:
        another engine won the race (a parallel start, a hedge, a rescue). It is a cost: the
        guard bills its prompt (`spent`, under its role), and `Policy.parallel_cloud_share`
        counts it."""
        if "cloud" not in self.started or self.engine in (None, "cloud"):
            return False
        if self.handoff is not None or self.speculation is not None:
            return False  # the cloud's work there is the plan's own (its records say what)
        return not any("cloud" in (s.from_engine, s.to_engine) for s in self.switches)

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


def _gaps_ms(tt: list[float]) -> list[float]:
    return [(b - a) * 1000.0 for a, b in zip(tt, tt[1:], strict=False)]


def _p99(values: list[float]) -> float | None:
    """The nearest-rank 99th percentile (None: no values)."""
    return nearest_rank(sorted(values), 0.99) if values else None


def _by_t(item: tuple[str, float]) -> float:
    return item[1]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
