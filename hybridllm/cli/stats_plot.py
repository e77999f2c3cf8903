"""`hybridllm stats --plot`: the TTFT distribution over time, as a PNG.

Each logged request is a dot (its TTFT at the time it was logged, coloured by the engine that
served it); the P50, P95 and P99 of each time slice (DDSketch, as `hybridllm stats` prints them)
are lines over the dots. The y axis is logarithmic: local and cloud TTFT differ by orders of
magnitude.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from hybridllm.cli.plotting import pyplot, save
from hybridllm.cli.stats_log import LoggedRequest, aggregate

SLICES = 24
COLOURS = {"local": "#1f77b4", "cloud": "#ff7f0e"}
LINE_COLOURS = {"P50": "#222222", "P95": "#9467bd", "P99": "#d62728"}  # apart from the dots


def ttft_over_time(
    requests: Sequence[LoggedRequest], window_s: float, path: Path, source: str
) -> Path:
    """Write the plot of `requests` (logged over the last `window_s` seconds) to `path`."""
    plt = pyplot("hybridllm stats --plot")
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for engine in sorted({r.engine or "none" for r in requests}):
        mine = [r for r in requests if (r.engine or "none") == engine and r.ttft_ms]
        ax.scatter(
            [_when(r.at) for r in mine],
            [r.ttft_ms for r in mine],
            s=9,
            alpha=0.45,
            color=COLOURS.get(engine, "#7f7f7f"),
            label=f"{engine} ({len(mine)})",
        )
    for name, (times, values) in _slice_percentiles(requests, window_s).items():
        ax.plot(
            times,
            values,
            marker="o",
            markersize=3,
            linewidth=1.4,
            label=name,
            color=LINE_COLOURS[name],
        )
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (ms, log scale)")
    ax.set_xlabel("time logged (UTC)")
    ax.set_title(f"TTFT over time: {len(requests)} requests")
    ax.grid(alpha=0.3, which="both")
    if requests:
        ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return save(fig, path, f"decision log {source}; drawn {now}")


def _slice_percentiles(
    requests: Sequence[LoggedRequest], window_s: float
) -> dict[str, tuple[list[dt.datetime], list[float]]]:
    """P50/P95/P99 of TTFT per time slice (slices with no TTFT are skipped)."""
    if not requests:
        return {}
    end = max(r.at for r in requests)
    start = max(min(r.at for r in requests), end - window_s)
    width = max((end - start) / SLICES, 1.0)
    slices: dict[int, list[LoggedRequest]] = {}
    for r in requests:
        slices.setdefault(min(int((r.at - start) // width), SLICES - 1), []).append(r)
    out: dict[str, tuple[list[dt.datetime], list[float]]] = {
        "P50": ([], []),
        "P95": ([], []),
        "P99": ([], []),
    }
    for index in sorted(slices):
        ttft = aggregate(slices[index], window_s).overall.ttft_ms
        if ttft.count == 0:
            continue
        for name, value in (("P50", ttft.p50), ("P95", ttft.p95), ("P99", ttft.p99)):
            if value is not None:
                out[name][0].append(_when(start + (index + 0.5) * width))
                out[name][1].append(value)
    return out


def _when(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC)
