"""The one writer of a request's trace.

`RequestRun` owns a `Recorder`; plans report to the run's verbs, which emit the app's event and
call the recorder from the same call, so an event and the trace cannot disagree. Nothing else
writes a trace: `Trace` is a frozen, slotted value. While the request runs, `Recorder.trace` is
the working trace (its sequences are the recorder's own lists, so it grows as the request goes
on); `freeze()` hands out the value, every sequence a tuple, and from then on `trace` is it.
Like anyio's memory streams: mutable state inside, a frozen snapshot handed out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hybridllm import clock
from hybridllm.events import EngineName, EngineUsage, FallbackCause, TokenLimit
from hybridllm.runtime.records import (
    Attempt,
    CascadeRecord,
    FallbackRecord,
    HandoffRecord,
    Pause,
    SeamRecord,
    Speculation,
    Spend,
    SpendRole,
    Switch,
    TextSpan,
    spend_role,
)
from hybridllm.runtime.trace import Trace

if TYPE_CHECKING:
    from hybridllm.guard.budget import TokenUsage
    from hybridllm.routing.decision import Decision

__all__ = ["Recorder"]

# the record a plan attaches (one of each kind per request)
PlanRecord = CascadeRecord | HandoffRecord | Speculation
_RECORD_FIELD: dict[type[Any], str] = {
    CascadeRecord: "cascade",
    HandoffRecord: "handoff",
    Speculation: "speculation",
}


class Recorder:
    """Writes one request's trace (see the module): each method records one fact."""

    def __init__(self, trace: Trace | None = None) -> None:
        """`trace`: the request's identity and clock (a new one: now)."""
        base = Trace() if trace is None else trace
        self.fallbacks: list[FallbackRecord] = list(base.fallbacks)
        self.spent: list[Spend] = list(base.spent)
        self.started: list[EngineName] = list(base.started)
        self.switches: list[Switch] = list(base.switches)
        self.pauses: list[Pause] = list(base.pauses)
        self.seams: list[SeamRecord] = list(base.seams)
        self.refusals: list[str] = list(base.refusals)
        self.token_times: list[float] = list(base.token_times)
        self.delivered_times: list[float] = list(base.delivered_times)
        self.spans: list[TextSpan] = list(base.spans)
        self.attempts: list[Attempt] = list(base.attempts)
        self.counted: list[EngineUsage] = list(base.counted)
        self.tool_calls: list[str] = list(base.tool_calls)
        self.marks: dict[str, float] = dict(base.marks)
        self._frozen: Trace | None = None
        self._working = replace(
            base,
            fallbacks=self.fallbacks,
            spent=self.spent,
            started=self.started,
            switches=self.switches,
            pauses=self.pauses,
            seams=self.seams,
            refusals=self.refusals,
            token_times=self.token_times,
            delivered_times=self.delivered_times,
            spans=self.spans,
            attempts=self.attempts,
            counted=self.counted,
            tool_calls=self.tool_calls,
            marks=self.marks,
        )

    @property
    def trace(self) -> Trace:
        """The working trace while the request runs; the frozen value once it is over."""
        return self._working if self._frozen is None else self._frozen

    def freeze(self) -> Trace:
        """The trace as a value: every sequence a tuple, every mapping a copy. Frozen again
        with nothing recorded since, it is the same value (`Done.trace is s.trace`)."""
        value = self._working.frozen()
        if value != self._frozen:
            self._frozen = value
        assert self._frozen is not None
        return self._frozen

    def _set(self, **changes: Any) -> None:
        """Set scalar fields of the working trace (the one place that does)."""
        for name, value in changes.items():
            object.__setattr__(self._working, name, value)
        if self._frozen is not None:  # a fact recorded after the end (the captured content)
            self.freeze()

    # ---- identity and the decision --------------------------------------------------------

    def admitted(self, policy: str) -> None:
        self._set(policy=policy)

    def decided(self, decision: Decision, predicted_ttft_ms: Mapping[str, float]) -> None:
        """The routing decision: its plan and objective, and each engine's predicted TTFT."""
        self._set(
            decision=decision,
            plan=decision.plan,
            objective=decision.objective,
            predicted_ttft_ms=dict(predicted_ttft_ms),
        )

    def seam(self, record: SeamRecord) -> None:
        """A continuation's seam, as judged before delivery."""
        self.seams.append(record)

    def continued_in(self, dialect: str) -> None:
        """A cloud continuation of the delivered text was asked in `dialect`."""
        self._set(continuation=dialect)

    def trimmed(self, dropped: int) -> None:
        """The oldest `dropped` messages were left out to fit the local context."""
        self._set(trimmed_messages=dropped)

    def captured(self, content: dict[str, Any]) -> None:
        """The prompt, the answer and the tool calls (only where the client captures content)."""
        self._set(content=content)

    # ---- engines --------------------------------------------------------------------------

    def started_engine(self, engine: EngineName) -> None:
        if engine not in self.started:
            self.started.append(engine)

    def serving(self, engine: EngineName, route_reason: str | None = None) -> None:
        """`engine` serves the answer from now on (`route_reason`: the route's words)."""
        self.started_engine(engine)
        if route_reason is None:
            self._set(engine=engine)
        else:
            self._set(engine=engine, route_reason=route_reason)

    def attempt(self, engine: EngineName, model: str, role: SpendRole, n: int = 1) -> Attempt:
        """An engine stream starts now (`Attempt.ended` closes it)."""
        record = Attempt(engine, model, role, clock.now(), attempt=n)
        self.attempts.append(record)
        return record

    def retried(self) -> None:
        self._set(retries=self._working.retries + 1)

    def refused(self, engine: EngineName, why: str) -> None:
        """A guard kept the request from `engine` (its words: never the secret)."""
        self.refusals.append(f"{engine}: {why}")

    def switch(self, record: Switch) -> None:
        self.switches.append(record)
        self._set(engine=record.to_engine)

    def pause(self, record: Pause) -> None:
        self.pauses.append(record)

    def plan_record(self, record: PlanRecord) -> None:
        """The plan's own record (the cascade's, the handoff's, the speculative plan's)."""
        self._set(**{_RECORD_FIELD[type(record)]: record})

    def counted_usage(self, usage: EngineUsage) -> None:
        """Tokens an engine spent outside an engine stream."""
        self.counted.append(usage)

    def settled(self, usage: TokenUsage, usd: float, overrun_usd: float = 0.0) -> None:
        """The cloud guard settled one of this request's cloud requests (its settle hook); the
        role comes from the task it ran in (`spend_role`)."""
        role = spend_role.get()
        p, c, est = usage.prompt_tokens, usage.completion_tokens, usage.estimated
        self.spent.append(Spend(role, p, c, usd, est, overrun_usd))

    # ---- time and text ----------------------------------------------------------------------

    def mark(self, name: str, t: float | None = None) -> None:
        """The first time a phase was seen (later repeats are ignored)."""
        self.marks.setdefault(name, clock.now() if t is None else t)

    def token(
        self, t: float, engine: EngineName | None = None, delivered: float | None = None
    ) -> None:
        """A content token (or tool call) produced at `t` by `engine` was handed to the app at
        `delivered` (None: at `t`)."""
        if not self.token_times:
            self.mark("first_token", t)
        if engine is not None and (not self.spans or self.spans[-1].engine != engine):
            self.spans.append(TextSpan(engine, len(self.token_times)))
        self.token_times.append(t)
        self.delivered_times.append(t if delivered is None else delivered)

    def tool_call(self, name: str) -> None:
        self.tool_calls.append(name)

    def token_limit(self, limit: TokenLimit) -> None:
        self._set(token_limit=limit)

    def deadline_missed(self, late_ms: float) -> None:
        self._set(deadline_missed_ms=late_ms)

    # ---- the end ----------------------------------------------------------------------------

    def usage(
        self,
        prompt: int | None,
        completion: int,
        cached: int | None,
        estimated: bool,
    ) -> None:
        self._set(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_prompt_tokens=cached,
            usage_estimated=estimated,
        )

    def done(self, finish_reason: str, t: float | None = None) -> None:
        at = clock.now() if t is None else t
        self._set(finish_reason=finish_reason, t_done=at)
        self.mark("done", at)

    def failed(self, exc: BaseException) -> None:
        """The error that ended the request (typed: what the app receives)."""
        self._set(error_type=type(exc), error=f"{type(exc).__name__}: {exc}")

    def ended(self) -> None:
        if self._working.t_done is None:
            self._set(t_done=clock.now())

    def fallback_record(
        self,
        from_engine: EngineName,
        to_engine: EngineName,
        cause: FallbackCause,
        reason: str,
        t: float,
    ) -> FallbackRecord:
        """Another engine started (or took the answer over), for `cause`."""
        record = FallbackRecord(t, from_engine, to_engine, cause, reason)
        self.fallbacks.append(record)
        self.started_engine(to_engine)
        return record
