"""The records a request's trace is made of (`runtime.trace`): each cloud request's money
(`Spend`), a pause on the device, a handoff, a switch, a fallback, an engine stream (`Attempt`),
a span of text, the cascade's and the speculative plan's own records. Plain data: the trace
holds them, `Trace.from_dict` (`runtime.trace_import`) rebuilds them."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hybridllm.events import EngineName, FallbackCause, Finish

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "CascadeDecision",
    "CascadeRecord",
    "FallbackRecord",
    "HandoffOutcome",
    "HandoffRecord",
    "Pause",
    "SeamKind",
    "SeamRecord",
    "Spend",
    "SpendRole",
    "Speculation",
    "Switch",
    "TextSpan",
    "Unverified",
    "spend_role",
]

# how a continuation joined the delivered text (`runtime.seam`)
SeamKind = Literal["clean", "overlap", "restart"]


@dataclass(frozen=True, slots=True)
class SeamRecord:
    """A continuation's seam, judged before delivery (`runtime.seam`): the continuing
    `engine`, the `kind`, the text of its opening that was cut ("" when clean), and how long
    its first text was held to judge it."""

    engine: str
    kind: SeamKind
    cut: str
    held_ms: float


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
    the signals read and their cost (`cost_ms`; `extra_ms` of it, what a local answer does not
    reuse: the option rotations), and the characters held; for a whole-answer judgement the
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
    extra_ms: float | None = None
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
