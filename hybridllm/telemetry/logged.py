"""A logged request back into the aggregates: the decision log's `trace` column (a
`Trace.to_dict()`) as the samples `Stats.add` takes, so `hybridllm stats` reads the log with the
same groups, the same attribution and the same DDSketch percentiles as `HybridClient.stats()`.

`samples_from_dict` rebuilds the row's trace (`Trace.from_dict`) and hands it to
`stats.request_samples`: one computation for both. A row logged before the log kept traces has
only its TTFT, engine, policy, error and fallback: `samples_from_columns` makes what it can of
those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridllm.runtime.trace import Trace
from hybridllm.telemetry.stats import Counts, GroupKey, Metric, Samples, request_samples

MetricValues = dict[Metric, list[float | None]]


def samples_from_dict(trace: Mapping[str, Any]) -> Samples:
    """Each group's share of one logged request: `stats.request_samples` of the trace the row
    describes (`Trace.from_dict`), so the log and the client count alike by construction."""
    return request_samples(Trace.from_dict(trace))


def samples_from_columns(row: Mapping[str, Any]) -> Samples:
    """What a row without a trace gives: its TTFT, and counts from its engine, error and
    fallback columns."""
    engine = row.get("engine")
    counts = Counts(
        requests=1,
        failures=int(row.get("error_kind") is not None),
        fallbacks=int(bool(row.get("fallback"))),
        cloud_answers=int(engine == "cloud"),  # a row without a trace: the two-engine names
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
