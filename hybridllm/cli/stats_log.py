"""The decision log's requests as `hybridllm stats` reads them: each row's samples for the
aggregator of `HybridClient.stats()` (`telemetry.stats.Stats`), from its trace where the row
has one (`telemetry.logged`), from its columns where it was logged before traces were kept."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridllm.errors import DecisionLogError
from hybridllm.routing.logs import decision_log_from_url, sqlite_path
from hybridllm.telemetry.logged import samples_from_columns, samples_from_dict
from hybridllm.telemetry.stats import Samples, Stats, StatsReport


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One row of the log: when it was logged (epoch seconds), its engine and its samples."""

    at: float
    engine: str | None
    ttft_ms: float | None
    samples: Samples


def read_log(url: str | Path, since_s: float, now: float | None = None) -> list[LoggedRequest]:
    """The requests logged within `since_s` seconds of `now` (default: the current time) in
    the log `url` names (a path, `sqlite://PATH` or `redis://...`: `decision_log_from_url`).
    A missing SQLite file is an error: opening one would create it."""
    path = sqlite_path(url, argument="--log")
    if path is not None and not path.is_file():
        raise DecisionLogError(f"no decision log at {path}")
    cutoff = (time.time() if now is None else now) - since_s
    log = decision_log_from_url(url, argument="--log")
    try:
        rows = log.rows(since=cutoff)
    finally:
        log.close()
    return [_logged(row) for row in rows]


def _logged(row: dict[str, Any]) -> LoggedRequest:
    stored = row.get("trace")
    samples = samples_from_dict(json.loads(stored)) if stored else samples_from_columns(row)
    return LoggedRequest(float(row["time"]), row.get("engine"), row.get("ttft_ms"), samples)


def aggregate(requests: Sequence[LoggedRequest], window_s: float) -> StatsReport:
    """The requests' figures through `Stats`, the aggregator of `HybridClient.stats()`."""
    stats = Stats(window_s=window_s, buckets=1)
    for request in requests:
        stats.add(request.samples)
    return stats.report()
