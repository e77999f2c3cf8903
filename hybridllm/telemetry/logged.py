"""A logged request back into the aggregates: the decision log's `trace` column (a
`Trace.to_dict()`) as the samples `Stats.add` takes, so `hybridllm stats` reads the log with the
same groups, the same attribution and the same DDSketch percentiles as `HybridClient.stats()`.

`samples_from_dict` mirrors `stats.request_samples` figure by figure, on the dict's fields:
delivered times `token_ms`, production times `produced_ms` (the hop is their difference), spans
of text by engine (`first_token`). A row logged before the log kept traces has only its TTFT,
engine, policy, error and fallback: `samples_from_columns` makes what it can of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridllm.telemetry.stats import Counts, GroupKey, Metric, Samples

MetricValues = dict[Metric, list[float | None]]


def samples_from_dict(trace: Mapping[str, Any]) -> Samples:
    """Each group's share of one logged request (see `stats.request_samples`)."""
    counts = _counts(trace)
    delivered: list[float] = list(trace.get("token_ms") or [])
    produced: list[float] = list(trace.get("produced_ms") or [])
    hops = [d - p for p, d in zip(produced, delivered, strict=False)]
    whole: MetricValues = {
        "ttft_ms": [trace.get("ttft_ms")],
        "tpot_ms": [trace.get("tpot_ms")],
        "itl_ms": list(trace.get("itl_ms") or []),
        "hop_ms": list(hops),
    }
    policy, engine = trace.get("policy"), trace.get("engine")
    started: list[str] = list(trace.get("started") or [])
    served = engine or (started[-1] if started else None)
    return _grouped(counts, whole, policy, served, _by_engine(trace, delivered, hops))


def samples_from_columns(row: Mapping[str, Any]) -> Samples:
    """What a row without a trace gives: its TTFT, and counts from its engine, error and
    fallback columns."""
    engine = row.get("engine")
    counts = Counts(
        requests=1,
        failures=int(row.get("error_kind") is not None),
        fallbacks=int(bool(row.get("fallback"))),
        cloud_answers=int(engine == "cloud"),
        cloud_started=int(engine == "cloud" or row.get("route") == "cloud"),
    )
    whole: MetricValues = {"ttft_ms": [row.get("ttft_ms")], "tpot_ms": [row.get("tpot_ms")]}
    mine = {engine: whole} if engine else {}
    return _grouped(counts, whole, row.get("policy"), engine, mine)


def _grouped(
    counts: Counts,
    whole: MetricValues,
    policy: str | None,
    served: str | None,
    per_engine: Mapping[str, MetricValues],
) -> Samples:
    """`stats.request_samples`'s groups: the whole request to the overall and policy groups
    (and to its engine where one engine wrote it all), else each engine its own spans."""
    keys: list[GroupKey] = [("all", "")]
    if policy is not None:
        keys.append(("policy", policy))
    if served is not None and set(per_engine) <= {served}:
        return [([*keys, ("engine", served)], counts, whole)]  # one engine wrote it all
    out: Samples = [(keys, counts, whole)]
    for engine in sorted({*per_engine, *([served] if served else [])}):
        share = counts if engine == served else Counts()
        out.append(([("engine", engine)], share, dict(per_engine.get(engine, {}))))
    return out


def _by_engine(
    trace: Mapping[str, Any], delivered: list[float], hops: list[float]
) -> dict[str, MetricValues]:
    """The values each engine's spans of text account for (`stats._by_engine`)."""
    spans = [(s["engine"], int(s["first_token"])) for s in trace.get("spans") or []]
    out: dict[str, MetricValues] = {}
    for i, (engine, first) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else len(delivered)
        times = delivered[max(first - 1, 0) : end]
        gaps: list[float | None] = [b - a for a, b in zip(times, times[1:], strict=False)]
        mine = out.setdefault(engine, {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "hop_ms": []})
        hop_end = spans[i + 1][1] if i + 1 < len(spans) else len(hops)
        mine["itl_ms"] += gaps
        mine["hop_ms"] += hops[first:hop_end]
        mine["tpot_ms"].append(sum(g for g in gaps if g is not None) / len(gaps) if gaps else None)
        if i == 0:
            mine["ttft_ms"].append(trace.get("ttft_ms"))
    return out


def _fell_back(trace: Mapping[str, Any]) -> bool:
    """`Trace.fell_back` of a logged row (rows written before `fallbacks` was exported: a
    fallback reason or a switch)."""
    if "fallbacks" in trace:
        return bool(trace["fallbacks"])
    return trace.get("fallback_reason") is not None or bool(trace.get("switches"))


def _counts(trace: Mapping[str, Any]) -> Counts:
    engines = {s["engine"] for s in trace.get("spans") or []}
    started = trace.get("started") or []
    return Counts(
        requests=1,
        failures=int(trace.get("error") is not None),
        fallbacks=int(_fell_back(trace)),
        hedges=int(bool(trace.get("hedged"))),
        parallel_starts=int(trace.get("parallel_engine") is not None),
        deadline_misses=int(trace.get("deadline_missed_ms") is not None),
        cloud_answers=int("cloud" in engines),
        cloud_started=int("cloud" in started),
        cloud_cancelled=int(bool(trace.get("cloud_cancelled"))),
        spend_usd=float(trace.get("cost_usd") or 0.0),
    )
