"""A trace back from its JSON-ready data (`Trace.from_dict`): the inverse of `trace_export`.

The rebuilt trace's clock starts at 0 (`t_start`): every time of the dict is milliseconds since
the call, so the figures (TTFT, ITL, the hop, the segments) come out as they went in, and
`to_dict()` of the rebuilt trace gives the same data. Errors come back as their class in
`hybridllm.errors` by name (a name that is not one: `HybridError`). A row exported before a
field existed gets that field's default; a row without `fallbacks` (logged before they were)
gets one record from its `fallback_reason` / `fallback_cause` (or `hedged`), and one for each
of its switches.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from hybridllm import errors
from hybridllm.events import EngineUsage, FallbackCause, Finish, TokenLimit
from hybridllm.routing.decision import Decision, Reason
from hybridllm.runtime.records import (
    Attempt,
    CascadeRecord,
    FallbackRecord,
    HandoffRecord,
    Pause,
    SeamRecord,
    Speculation,
    Spend,
    Switch,
    TextSpan,
)

__all__ = ["trace_fields"]

Trace = SimpleNamespace  # the fields of the trace being rebuilt, by name

Row = Mapping[str, Any]


def trace_fields(d: Row) -> dict[str, Any]:
    """The `Trace` fields that `d` (a `Trace.to_dict()`) describes (`Trace.from_dict` makes
    the trace of them: this module knows the records, not the trace)."""
    trace = Trace(t_start=0.0, wall_start=float(d.get("started_at") or 0.0))
    _identity(trace, d)
    _timing(trace, d)
    _orchestration(trace, d)
    _money(trace, d)
    if d.get("content") is not None:
        trace.content = dict(d["content"])
    return vars(trace)


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _error_class(name: str | None) -> type[Exception] | None:
    if name is None:
        return None
    found = getattr(errors, name, None)
    ok = isinstance(found, type) and issubclass(found, errors.HybridError)
    return found if ok else errors.HybridError


def _identity(t: Trace, d: Row) -> None:
    if d.get("request_id"):
        t.request_id = d["request_id"]
    t.policy, t.plan, t.objective = d.get("policy"), d.get("plan"), d.get("objective")
    t.engine, t.route_reason = d.get("engine"), d.get("route_reason") or ""
    t.device = d.get("device", "local")  # a row from before engines had names: "local"
    t.decision = _decision(d.get("routing_decision"))
    t.finish_reason = d.get("finish_reason")
    err = d.get("error")
    if err is not None:
        t.error_type, t.error = _error_class(err.get("type")), err.get("text")


def _decision(d: Row | None) -> Decision | None:
    if d is None:
        return None
    fields = dict(d)
    fields["reasons"] = tuple(Reason(r["code"], r["text"]) for r in d.get("reasons") or ())
    fields["unavailable"] = tuple((e, why) for e, why in d.get("unavailable") or ())
    fields["overflowed"] = tuple(d.get("overflowed") or ())
    return Decision(**fields)


def _timing(t: Trace, d: Row) -> None:
    t.marks = {name: ms / 1000.0 for name, ms in (d.get("segments_ms") or {}).items()}
    t.t_done = _s(d.get("total_ms"))
    t.delivered_times = [ms / 1000.0 for ms in d.get("token_ms") or ()]
    produced = d.get("produced_ms")
    t.token_times = [ms / 1000.0 for ms in produced] if produced else list(t.delivered_times)
    t.deadline_missed_ms = d.get("deadline_missed_ms")
    t.predicted_ttft_ms = dict(d.get("predicted_ttft_ms") or {})


def _orchestration(t: Trace, d: Row) -> None:
    t.spans = [TextSpan(s["engine"], int(s["first_token"])) for s in d.get("spans") or ()]
    t.attempts = [_attempt(a) for a in d.get("attempts") or ()]
    t.started = list(d.get("started") or ())
    t.retries = int(d.get("retries") or 0)
    t.trimmed_messages = int(d.get("trimmed_messages") or 0)
    t.continuation = d.get("continuation")
    t.fallbacks = _fallbacks(d, t.started)
    t.switches = [_switch(s) for s in d.get("switches") or ()]
    t.pauses = [_pause(p) for p in d.get("pauses") or ()]
    t.seams = [SeamRecord(**s) for s in d.get("seams") or ()]
    t.handoff = _handoff(d.get("handoff"))
    cascade = d.get("cascade")
    t.cascade = None if cascade is None else CascadeRecord(**cascade)
    spec = d.get("speculation")
    t.speculation = None if spec is None else Speculation(**spec)
    t.tool_calls = list(d.get("tool_calls") or ())
    t.refusals = list(d.get("refusals") or ())
    t.counted = [EngineUsage(**u) for u in d.get("counted") or ()]


def _attempt(a: Row) -> Attempt:
    f = a.get("finish")
    finish = None
    if f is not None:
        fields = {k: v for k, v in f.items() if k != "at_ms"}
        finish = Finish(**fields, t=_s(f.get("at_ms")) or 0.0)
    return Attempt(
        a["engine"],
        a.get("model") or "",
        a.get("role") or "primary",
        _s(a.get("start_ms")) or 0.0,
        t_first=_s(a.get("first_token_ms")),
        t_end=_s(a.get("end_ms")),
        outcome=a.get("outcome") or "finished",
        error_type=_error_class(a.get("error_type")),
        tokens=int(a.get("tokens") or 0),
        attempt=int(a.get("attempt") or 1),
        finish=finish,
    )


def _fallbacks(d: Row, started: list[Any]) -> list[FallbackRecord]:
    if "fallbacks" in d:
        return [
            FallbackRecord(_s(f["at_ms"]) or 0.0, f["from"], f["to"], f["cause"], f["reason"])
            for f in d["fallbacks"]
        ] + _parallel_before(d)
    out: list[FallbackRecord] = _parallel_before(d)  # a row logged before: its reasons
    reason = d.get("fallback_reason")
    if reason is not None and len(started) >= 2:
        cause: FallbackCause = d.get("fallback_cause") or ("hedge" if d.get("hedged") else "failed")
        out.append(FallbackRecord(0.0, started[0], started[1], cause, reason))
    for s in d.get("switches") or ():
        at = _s(s.get("at_ms")) or 0.0
        out.append(FallbackRecord(at, s["from"], s["to"], "mid_stream", s.get("reason") or ""))
    return out


def _parallel_before(d: Row) -> list[FallbackRecord]:
    """A parallel start a row names without its fallback record (a cascade's, logged before a
    parallel start was always one)."""
    engine = d.get("parallel_engine")
    have = any(f.get("cause") == "parallel" for f in d.get("fallbacks") or ())
    if engine is None or have or d.get("fallback_cause") == "parallel":
        return []
    first = (d.get("started") or [d.get("engine") or "local"])[0]
    return [FallbackRecord(0.0, first, engine, "parallel", d.get("parallel_start") or "")]


def _switch(s: Row) -> Switch:
    at = _s(s.get("at_ms")) or 0.0
    err = _error_class(s.get("error_type"))
    return Switch(at, s["from"], s["to"], s.get("reason") or "", s["delivered_chars"], err)


def _pause(p: Row) -> Pause:
    paused, resumed = _s(p["paused_ms"]) or 0.0, _s(p["resumed_ms"]) or 0.0
    return Pause(paused, resumed, p["reason"], p["delivered_tokens"], p["prefill_tokens"])


def _handoff(h: Row | None) -> HandoffRecord | None:
    if h is None:
        return None
    fields: dict[str, Any] = {k: v for k, v in h.items() if not k.endswith("_ms")}
    fields.update({k[:-3] + "_t": _s(v) for k, v in h.items() if k.endswith("_ms")})
    fields["asked_t"] = fields.get("asked_t") or 0.0
    return HandoffRecord(**fields)


def _money(t: Trace, d: Row) -> None:
    usage = d.get("usage") or {}
    t.prompt_tokens, t.completion_tokens = (
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
    )
    t.cached_prompt_tokens = usage.get("cached_prompt_tokens")
    t.usage_estimated = bool(usage.get("estimated"))
    limit = d.get("token_limit")
    t.token_limit = None if limit is None else TokenLimit(**limit)
    t.spent = [Spend(**s) for s in d.get("spent") or ()]
