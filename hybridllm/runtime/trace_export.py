"""A trace as JSON-ready data (`Trace.to_dict()`, `Trace.to_json()`).

Times are milliseconds since the `stream()` call (`started_at` gives that call's wall-clock
time, seconds since the epoch). No prompt or answer text, and no tool-call arguments, unless
the client captured them (`HybridClient(capture_content=True)`, or
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`): then `content` holds them.
Errors are named by class; their words for people go beside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridllm.events import Finish
    from hybridllm.runtime.trace import Attempt, FallbackRecord, Trace


def trace_dict(trace: Trace) -> dict[str, Any]:
    """Every figure of the trace (see the module's doc)."""
    return {
        **_identity(trace),
        **_timing(trace),
        **_orchestration(trace),
        **_money(trace),
        **({"content": dict(trace.content)} if trace.content is not None else {}),
    }


def _identity(t: Trace) -> dict[str, Any]:
    return {
        "request_id": t.request_id,
        "started_at": t.wall_start,
        "policy": t.policy,
        "plan": t.plan,
        "objective": t.objective,
        "engine": t.engine,
        "device": t.device,
        "route_reason": t.route_reason,
        "decision": list(t.reasons),
        "reason_codes": list(t.reason_codes),
        # the typed decision whole (`Trace.from_dict` rebuilds it), its reasons with their codes
        "routing_decision": None if t.decision is None else asdict(t.decision),
        "finish_reason": t.finish_reason,
        "error": None if t.error_type is None else {"type": t.error_type.__name__, "text": t.error},
    }


def _timing(t: Trace) -> dict[str, Any]:
    hops = t.hop_ms
    return {
        "segments_ms": t.segments_ms,
        "ttft_ms": t.ttft_ms,
        "produced_ttft_ms": t.produced_ttft_ms,
        "tpot_ms": t.tpot_ms,
        "itl_ms": t.itl_ms,
        "itl_p99_ms": t.itl_p99_ms,
        "total_ms": t.total_ms,
        "token_ms": _rel(t, t.times),
        "produced_ms": _rel(t, t.token_times),
        "hop_ms": _spread(hops),
        "deadline_missed_ms": t.deadline_missed_ms,
        "predicted_ttft_ms": dict(t.predicted_ttft_ms),
    }


def _orchestration(t: Trace) -> dict[str, Any]:
    return {
        "spans": [{"engine": s.engine, "first_token": s.first} for s in t.spans],
        "attempts": [_attempt(t, a) for a in t.attempts],
        "started": list(t.started),
        "hedged": t.hedged,
        "retries": t.retries,
        "trimmed_messages": t.trimmed_messages,
        "continuation": t.continuation,
        "fallback_reason": t.fallback_reason,
        "fallback_cause": t.fallback_cause,
        "fallbacks": [_fallback(t, f) for f in t.fallbacks],
        "parallel_engine": t.parallel_engine,
        "parallel_start": t.parallel_start,
        "switches": [_switch(t, s) for s in t.switches],
        "pauses": [_pause(t, p) for p in t.pauses],
        "seams": [_seam(s) for s in t.seams],
        "handoff": None if t.handoff is None else _rel_fields(t, asdict(t.handoff)),
        "cascade": None if t.cascade is None else t.cascade.as_dict(),
        "speculation": None if t.speculation is None else asdict(t.speculation),
        "tool_calls": list(t.tool_calls),
        "refusals": list(t.refusals),
        "counted": [asdict(u) for u in t.counted],
    }


def _money(t: Trace) -> dict[str, Any]:
    return {
        "usage": {
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "cached_prompt_tokens": t.cached_prompt_tokens,
            "estimated": t.usage_estimated,
            "by_engine": [asdict(u) for u in t.usage_by_engine()],
        },
        "token_limit": None if t.token_limit is None else asdict(t.token_limit),
        "cost_usd": t.cost_usd,
        "overrun_usd": t.overrun_usd,
        "cloud_cancelled": t.cloud_cancelled,
        "spent": [asdict(s) for s in t.spent],
    }


def _attempt(t: Trace, a: Attempt) -> dict[str, Any]:
    return {
        "engine": a.engine,
        "model": a.model,
        "role": a.role,
        "attempt": a.attempt,
        "start_ms": _ms(t, a.t_start),
        "first_token_ms": _ms(t, a.t_first),
        "end_ms": _ms(t, a.t_end),
        "outcome": a.outcome,
        "error_type": None if a.error_type is None else a.error_type.__name__,
        "tokens": a.tokens,
        "finish": None if a.finish is None else _finish(t, a.finish),
    }


def _finish(t: Trace, f: Finish) -> dict[str, Any]:
    """An engine's report at the end of its stream (its time as milliseconds since the call)."""
    out = {k: v for k, v in asdict(f).items() if k != "t"}
    return {**out, "at_ms": _ms(t, f.t)}


def _fallback(t: Trace, f: FallbackRecord) -> dict[str, Any]:
    return {
        "at_ms": _ms(t, f.at),
        "from": f.from_engine,
        "to": f.to_engine,
        "cause": f.cause,
        "reason": f.reason,
    }


def _switch(t: Trace, s: Any) -> dict[str, Any]:
    err = s.error_type
    return {
        "at_ms": _ms(t, s.at),
        "from": s.from_engine,
        "to": s.to_engine,
        "reason": s.reason,
        "delivered_chars": s.delivered_chars,
        "error_type": None if err is None else err.__name__,
    }


def _seam(s: Any) -> dict[str, Any]:
    return {"engine": s.engine, "kind": s.kind, "cut": s.cut, "held_ms": s.held_ms}


def _pause(t: Trace, p: Any) -> dict[str, Any]:
    return {
        "paused_ms": _ms(t, p.paused_at),
        "resumed_ms": _ms(t, p.resumed_at),
        "reason": p.reason,
        "delivered_tokens": p.delivered_tokens,
        "prefill_tokens": p.prefill_tokens,
    }


def _rel_fields(t: Trace, d: dict[str, Any]) -> dict[str, Any]:
    """A record's `*_t` times as milliseconds since the call (`*_ms`)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key.endswith("_t"):
            out[key[:-2] + "_ms"] = _ms(t, value)
        else:
            out[key] = value
    return out


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p50, p99 = nearest_rank(ordered, 0.5), nearest_rank(ordered, 0.99)
    return {"p50": p50, "p99": p99, "max": ordered[-1], "n": len(ordered)}


def nearest_rank(ordered: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of sorted, non-empty `ordered`."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _ms(t: Trace, at: float | None) -> float | None:
    return None if at is None else (at - t.t_start) * 1000.0


def _rel(t: Trace, times: Sequence[float]) -> list[float]:
    return [(x - t.t_start) * 1000.0 for x in times]
