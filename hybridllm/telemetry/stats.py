"""Rolling aggregates over finished requests (`HybridClient.stats()`).

Percentiles of TTFT, TPOT, ITL and the production-to-delivery hop, per engine, per policy and
overall, over a rolling window; with counts of requests, failures, fallbacks, hedges, parallel
starts, deadline misses, the cloud's share and the spend.

The percentiles come from DDSketch (the `ddsketch` package, Datadog's reference
implementation): a quantile sketch with a relative-error guarantee on the value it returns
(`relative_accuracy`, 0.5% by default: a P99 of 412 ms is reported within +/- 2 ms), mergeable
(the window is a ring of time buckets merged when read) and bounded (at most `BIN_LIMIT`
bins per sketch, whatever the traffic; past it the lowest bins collapse, which only touches
the lowest quantiles). An HDR histogram bounds the error as well but needs a fixed integer range
chosen up front; a t-digest has no bound at a given quantile.

Where a request's answer came from two engines (a failover, a handoff), each span's gaps go to
the engine that wrote it; its TTFT goes to the engine of the first token. A quantile follows
DDSketch's rank rule: the value at rank `q * (n - 1)`, rounded down.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ddsketch import LogCollapsingLowestDenseDDSketch

from hybridllm.events import EngineName
from hybridllm.runtime.trace import Trace

BIN_LIMIT = 2048
Metric = Literal["ttft_ms", "tpot_ms", "itl_ms", "hop_ms"]
METRICS: tuple[Metric, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "hop_ms")
GroupKey = tuple[Literal["all", "engine", "policy"], str]


@dataclass(frozen=True, slots=True)
class Percentiles:
    """One metric's distribution over the window (None: no sample)."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class Counts:
    """What happened to the requests of a group over the window. `cloud_answers`: requests whose
    answer came at least in part from the cloud; `cloud_started`: requests that started a cloud
    request (served or not: a lost race is paid for too)."""

    requests: int = 0
    failures: int = 0
    fallbacks: int = 0  # another engine started: a rescue, a failover, a switch mid-answer
    hedges: int = 0
    parallel_starts: int = 0
    deadline_misses: int = 0
    cloud_answers: int = 0
    cloud_started: int = 0
    cloud_cancelled: int = 0
    # continuations whose seam the check cut (an overlap or a restart: `Trace.seams`)
    seams_cut: int = 0
    spend_usd: float = 0.0

    @property
    def cloud_share(self) -> float | None:
        return None if not self.requests else self.cloud_answers / self.requests

    def plus(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


@dataclass(frozen=True, slots=True)
class GroupStats:
    counts: Counts
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    hop_ms: Percentiles

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {m: _as_dict(getattr(self, m)) for m in METRICS}
        out["counts"] = {**_as_dict(self.counts), "cloud_share": self.counts.cloud_share}
        return out


@dataclass(frozen=True, slots=True)
class StatsReport:
    """`HybridClient.stats()`: the window's figures overall, per serving engine, per policy."""

    window_s: float
    overall: GroupStats
    engines: dict[str, GroupStats]
    policies: dict[str, GroupStats]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "overall": self.overall.to_dict(),
            "engines": {k: v.to_dict() for k, v in self.engines.items()},
            "policies": {k: v.to_dict() for k, v in self.policies.items()},
        }


class _Group:
    """The sketches and counts of one group in one time bucket."""

    __slots__ = ("counts", "sketches")

    def __init__(self, accuracy: float) -> None:
        self.counts = Counts()
        self.sketches = {m: LogCollapsingLowestDenseDDSketch(accuracy, BIN_LIMIT) for m in METRICS}

    def add(self, metric: Metric, values: Iterable[float | None]) -> None:
        sketch = self.sketches[metric]
        for v in values:
            if v is not None and math.isfinite(v):
                sketch.add(max(v, 0.0))


@dataclass
class _Bucket:
    index: int
    groups: dict[GroupKey, _Group] = field(default_factory=dict)


class Stats:
    """The rolling window: `window_s` split into `buckets` slices; a slice older than the
    window is dropped whole (so the window is `window_s` plus up to one slice)."""

    def __init__(
        self,
        window_s: float = 3600.0,
        buckets: int = 12,
        relative_accuracy: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.buckets, self.accuracy = window_s, buckets, relative_accuracy
        self._width = window_s / buckets
        self._clock = clock
        self._ring: list[_Bucket] = []
        self._lock = threading.Lock()

    def record(self, trace: Trace) -> None:
        """Add one finished request: its figures go into one sketch per metric once, which is
        then merged into each of its groups (a merge costs the bins, not the samples)."""
        self.add(request_samples(trace))

    def add(self, samples: Samples) -> None:
        """Add one request's samples (`request_samples`, or `telemetry.logged` for a request
        read back from the decision log)."""
        groups = self._groups_of(samples)
        with self._lock:
            bucket = self._bucket()
            for key, group in groups:
                _merge_into(bucket.groups, key, group, self.accuracy)

    def _groups_of(self, samples: Samples) -> list[tuple[GroupKey, _Group]]:
        """The request's share of each group it belongs to (groups given the same sample share
        one `_Group`: it is only read when merged)."""
        out: list[tuple[GroupKey, _Group]] = []
        for keys, counts, metrics in samples:
            group = _Group(self.accuracy)
            group.counts = counts
            for metric, values in metrics.items():
                group.add(metric, values)
            out += [(key, group) for key in keys]
        return out

    def report(self) -> StatsReport:
        """The figures of the window, merged from its buckets."""
        with self._lock:
            self._expire()
            merged: dict[GroupKey, _Group] = {}
            for bucket in self._ring:
                for key, group in bucket.groups.items():
                    _merge_into(merged, key, group, self.accuracy)
        stats = {key: _summary(g) for key, g in merged.items()}
        empty = _summary(_Group(self.accuracy))
        return StatsReport(
            self.window_s,
            stats.get(("all", ""), empty),
            {name: s for (kind, name), s in stats.items() if kind == "engine"},
            {name: s for (kind, name), s in stats.items() if kind == "policy"},
        )

    def _bucket(self) -> _Bucket:
        index = int(self._clock() // self._width)
        if not self._ring or self._ring[-1].index != index:
            self._ring.append(_Bucket(index))
            self._expire()
        return self._ring[-1]

    def _expire(self) -> None:
        oldest = int(self._clock() // self._width) - self.buckets
        self._ring = [b for b in self._ring if b.index > oldest]


Samples = list[tuple[list[GroupKey], Counts, dict[Metric, list[float | None]]]]


def request_samples(trace: Trace) -> Samples:
    """One request's samples, each with the groups it goes to: its counts and metric values."""
    counts = _counts(trace)
    whole: dict[Metric, list[float | None]] = {
        "ttft_ms": [trace.ttft_ms],
        "tpot_ms": [trace.tpot_ms],
        "itl_ms": list(trace.itl_ms),
        "hop_ms": list(trace.hop_ms),
    }
    keys: list[GroupKey] = [("all", "")]
    if trace.policy is not None:
        keys.append(("policy", trace.policy))
    served = trace.engine or (trace.started[-1] if trace.started else None)
    if served is not None and {s.engine for s in trace.spans} <= {served}:
        return [([*keys, ("engine", served)], counts, whole)]  # one engine wrote it all
    out: Samples = [(keys, counts, whole)]
    per_engine = _by_engine(trace)
    for engine in sorted({*per_engine, *([served] if served else [])}):
        share = counts if engine == served else Counts()
        out.append(([("engine", engine)], share, per_engine.get(engine, {})))
    return out


def _by_engine(trace: Trace) -> dict[EngineName, dict[Metric, list[float | None]]]:
    """The metric values each engine's spans of text account for."""
    out: dict[EngineName, dict[Metric, list[float | None]]] = {}
    hops, spans = trace.hop_ms, trace.spans
    for i, (engine, gaps) in enumerate(trace.span_itl_ms()):
        mine = out.setdefault(engine, {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "hop_ms": []})
        end = spans[i + 1].first if i + 1 < len(spans) else len(hops)
        mine["itl_ms"] += gaps
        mine["hop_ms"] += hops[spans[i].first : end]
        mine["tpot_ms"].append(sum(gaps) / len(gaps) if gaps else None)
        if i == 0:
            mine["ttft_ms"].append(trace.ttft_ms)
    return out


def _counts(trace: Trace) -> Counts:
    engines = {s.engine for s in trace.spans}
    return Counts(
        requests=1,
        failures=int(trace.error_type is not None),
        fallbacks=int(trace.fell_back),
        hedges=int(trace.hedged),
        parallel_starts=int(trace.parallel_engine is not None),
        deadline_misses=int(trace.deadline_missed_ms is not None),
        cloud_answers=int(any(map(trace.on_cloud, engines))),
        cloud_started=int(any(map(trace.on_cloud, trace.started))),
        cloud_cancelled=int(trace.cloud_cancelled),
        seams_cut=sum(s.kind != "clean" for s in trace.seams),
        spend_usd=trace.cost_usd or 0.0,
    )


def _merge_into(
    merged: dict[GroupKey, _Group], key: GroupKey, group: _Group, accuracy: float
) -> None:
    into = merged.get(key)
    if into is None:
        into = merged[key] = _Group(accuracy)
    into.counts = into.counts.plus(group.counts)
    for metric in METRICS:
        if group.sketches[metric].count:
            into.sketches[metric].merge(group.sketches[metric])


def _summary(group: _Group) -> GroupStats:
    return GroupStats(group.counts, *(_percentiles(group.sketches[m]) for m in METRICS))


def _percentiles(sketch: LogCollapsingLowestDenseDDSketch) -> Percentiles:
    n = int(sketch.count)
    if not n:
        return Percentiles(0, None, None, None, None)
    q = sketch.get_quantile_value
    return Percentiles(n, q(0.5), q(0.95), q(0.99), q(1.0))


def _values(counts: Counts) -> tuple[Any, ...]:
    return tuple(getattr(counts, name) for name in counts.__slots__)


def _as_dict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}
