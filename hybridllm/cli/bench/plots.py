"""`hybridllm bench --plots DIR`: the four figures as PNGs, each captioned with the machine, the
models, their quantization, the llama.cpp build and the date (`MachineInfo.caption`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridllm.cli.bench.results import BenchResults, check_line, median_ttft
from hybridllm.cli.plotting import pyplot, save

COLOURS = {"local": "#1f77b4", "cloud": "#ff7f0e"}
STRATEGY_COLOURS = ("#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd")
SKETCH_ACCURACY = 0.005  # `Telemetry(relative_accuracy=...)`'s default, which the bench uses
PART_MARKERS = {"input": "o", "concurrency": "s", "mixed": "^"}


def write_plots(results: BenchResults, directory: Path) -> list[Path]:
    """Write every figure into `directory`; returns their paths."""
    plt = pyplot("hybridllm bench --plots")
    caption = results.machine.caption()
    return [
        save(ttft_vs_input(plt, results), directory / "ttft_vs_input.png", caption),
        save(concurrency(plt, results), directory / "concurrency.png", caption),
        save(total_check(plt, results), directory / "total_time_check.png", caption),
        save(ttft_cdf(plt, results), directory / "ttft_cdf.png", caption),
    ]


def ttft_vs_input(plt: Any, results: BenchResults) -> Any:
    """TTFT against prompt tokens per engine (each request a dot, medians joined), with the
    local prefill floor beside the local curve."""
    fig, ax = plt.subplots(figsize=(8, 5))
    samples = [s for s in results.part("input") if s.ttft_ms is not None and s.input_tokens]
    for engine in ("local", "cloud"):
        mine = [s for s in samples if s.label == engine]
        if not mine:
            continue
        colour = COLOURS[engine]
        ax.scatter(
            [s.input_tokens for s in mine], [s.ttft_ms for s in mine], color=colour, alpha=0.5, s=18
        )
        xs, ys = median_ttft(mine)
        ax.plot(xs, ys, marker="o", color=colour, label=f"{engine} TTFT (median)")
        if engine == "local" and results.prefill_tps:
            floor = [results.floor_ms(x) for x in xs]
            ax.plot(
                xs,
                floor,
                linestyle="--",
                color=colour,
                alpha=0.7,
                label=f"local floor: tokens / {results.prefill_tps:.0f} tok/s prefill",
            )
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT against input length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def concurrency(plt: Any, results: BenchResults) -> Any:
    """The cloud's TPOT P50 and total throughput against requests in flight."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    points = results.concurrency
    levels = [p.concurrency for p in points]
    left.plot(levels, [p.tpot_p50_ms for p in points], marker="o", color=COLOURS["cloud"])
    left.set_ylabel("TPOT P50 (ms per token)", color=COLOURS["cloud"])
    left.set_title("cloud TPOT (and TTFT) against concurrency")
    waits = left.twinx()  # a server that serves one request at a time queues the others
    waits.plot(levels, [p.ttft_p50_ms for p in points], marker="s", linestyle="--", color="#7f7f7f")
    waits.set_ylabel("TTFT P50 (ms), dashed", color="#7f7f7f")
    waits.set_ylim(bottom=0)
    right.plot(levels, [p.throughput_tps for p in points], marker="o", color="#2ca02c")
    right.set_ylabel("output tokens per second, all requests")
    right.set_title("cloud total throughput against concurrency")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("requests at once")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    return fig


def total_check(plt: Any, results: BenchResults) -> Any:
    """Measured total time against TTFT + TPOT x (tokens - 1) for every request (log-log),
    and what is left over: the time from the last token to the end of the stream."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5))
    pairs = [
        (s, p, s.total_ms)
        for s in results.samples
        if s.total_ms is not None and (p := s.predicted_total_ms) is not None
    ]
    for part, marker in PART_MARKERS.items():
        for engine, colour in COLOURS.items():
            mine = [(p, t) for s, p, t in pairs if s.part == part and s.engine == engine]
            if not mine:
                continue
            style = {"marker": marker, "color": colour, "alpha": 0.6, "s": 22}
            left.scatter(*zip(*mine, strict=True), label=f"{part}, {engine}", **style)
            right.scatter([t for _, t in mine], [t - p for p, t in mine], **style)
    ends = [min([p for _, p, _ in pairs] or [1.0]), max([t for _, _, t in pairs] or [10.0])]
    left.plot(ends, ends, color="#555555", linewidth=1, label="equal")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("TTFT + TPOT x (tokens - 1)  (ms, log)")
    left.set_ylabel("measured total time (ms, log)")
    left.set_title("total time against TTFT + TPOT x tokens")
    left.legend(fontsize=7, loc="upper left")
    right.axhline(0.0, color="#555555", linewidth=1)
    right.set_xscale("log")
    right.set_xlabel("measured total time (ms, log)")
    right.set_ylabel("measured - (TTFT + TPOT x (tokens - 1))  (ms)")
    right.set_title(check_line(results).replace(": ", ":\n", 1), fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    return fig


def ttft_cdf(plt: Any, results: BenchResults) -> Any:
    """The TTFT CDF of each strategy on the mixed workload, with the P50/P95/P99 that
    `client.stats()` reported marked on the curve (DDSketch's rank rule, the value at rank
    q x (n - 1): with few requests P99 is not the largest one) and written in the legend."""
    fig, ax = plt.subplots(figsize=(9, 5))
    mixed = results.part("mixed")
    for run, colour in zip(results.strategies, STRATEGY_COLOURS, strict=False):
        ttft = sorted(s.ttft_ms for s in mixed if s.label == run.name and s.ttft_ms is not None)
        if not ttft:
            continue
        p = run.overall.ttft_ms
        marks = [(m, v) for m, v in (("o", p.p50), ("s", p.p95), ("D", p.p99)) if v is not None]
        label = f"{run.name}: P50 / P95 / P99 " + " / ".join(f"{v:.0f}" for _, v in marks) + " ms"
        ys = [(i + 1) / len(ttft) for i in range(len(ttft))]
        ax.step(ttft, ys, where="post", color=colour, label=label)
        for marker, value in marks:
            # the curve at the value: the sketch returns it within its 0.5% relative accuracy
            share = sum(t <= value * (1 + 2 * SKETCH_ACCURACY) for t in ttft) / len(ttft)
            ax.plot(
                [value], [share], marker=marker, color=colour, markersize=7, markeredgecolor="black"
            )
    for name, marker in (("P50", "o"), ("P95", "s"), ("P99", "D")):
        ax.plot(
            [],
            [],
            marker=marker,
            linestyle="",
            color="#999999",
            markeredgecolor="black",
            label=f"{name} (client.stats())",
        )
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("share of requests with TTFT at or below")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"TTFT CDF per routing strategy, mixed workload ({len(mixed)} requests)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return fig
