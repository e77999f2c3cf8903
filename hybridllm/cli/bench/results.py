"""What `hybridllm bench` measured, typed: each request's figures from its trace, each
concurrency level, each routing strategy's distribution from `client.stats()`; and the JSON and
the terminal tables made from them (no model needed: tests build them from canned results)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rich.table import Table

from hybridllm.cli.bench.machine import MachineInfo
from hybridllm.cli.bench.options import BenchConfig
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry.stats import GroupStats

Part = Literal["input", "concurrency", "mixed"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One request as its trace saw it. `label`: the engine asked for (input length,
    concurrency) or the strategy (mixed workload); `engine`: the one that served it."""

    part: Part
    label: str
    engine: str | None
    input_tokens: int | None
    output_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    total_ms: float | None
    concurrency: int = 1

    @classmethod
    def of(cls, part: Part, label: str, trace: Trace, concurrency: int = 1) -> Sample:
        return cls(
            part,
            label,
            trace.engine,
            trace.prompt_tokens,
            trace.n_tokens,
            trace.ttft_ms,
            trace.tpot_ms,
            trace.total_ms,
            concurrency,
        )

    @property
    def predicted_total_ms(self) -> float | None:
        """TTFT + TPOT x (output tokens - 1): TPOT is the mean gap after the first token."""
        if self.ttft_ms is None or self.tpot_ms is None or self.output_tokens < 2:
            return None
        return self.ttft_ms + self.tpot_ms * (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class ConcurrencyPoint:
    """`concurrency` cloud requests started at once: the wall time until the last ended, the
    output tokens of all of them and their TPOT and TTFT P50 (`client.stats()`)."""

    concurrency: int
    wall_s: float
    output_tokens: int
    tpot_p50_ms: float | None
    ttft_p50_ms: float | None

    @property
    def throughput_tps(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StrategyRun:
    """The mixed workload under one strategy: `client.stats()` over its requests."""

    name: str
    overall: GroupStats


@dataclass(frozen=True, slots=True)
class BenchResults:
    machine: MachineInfo
    config: BenchConfig
    warm_up_prefill_tps: float | None  # the local engine's, measured at its warm-up
    decode_ms: float | None  # the local engine's time per token, measured at its warm-up
    samples: Sequence[Sample]
    concurrency: Sequence[ConcurrencyPoint]
    strategies: Sequence[StrategyRun]
    elapsed_s: float

    def part(self, part: Part) -> list[Sample]:
        return [s for s in self.samples if s.part == part]

    @property
    def prefill_tps(self) -> float | None:
        """The local engine's prefill rate for the floor: the best the input-length part
        measured (prompt tokens / TTFT, so the fixed cost of a request counts against it, and
        the floor is at or below every local TTFT measured); the warm-up's figure where that
        part has no local request."""
        rates = [
            s.input_tokens / s.ttft_ms * 1000.0
            for s in self.part("input")
            if s.label == "local" and s.input_tokens and s.ttft_ms
        ]
        return max(rates) if rates else self.warm_up_prefill_tps

    def floor_ms(self, input_tokens: int) -> float | None:
        """The local prefill floor: prompt tokens / measured prefill rate."""
        rate = self.prefill_tps
        return None if not rate else input_tokens / rate * 1000.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine.to_dict(),
            "config": self.config.to_dict(),
            "local_rates": {
                "prefill_tps": self.prefill_tps,
                "warm_up_prefill_tps": self.warm_up_prefill_tps,
                "warm_up_decode_ms": self.decode_ms,
            },
            "ttft_vs_input": [_input_row(self, s) for s in self.part("input")],
            "concurrency": [_concurrency_row(p) for p in self.concurrency],
            "total_time_check": total_check(self.samples),
            "strategies": {r.name: r.overall.to_dict() for r in self.strategies},
            "samples": [asdict(s) for s in self.samples],
            "elapsed_s": self.elapsed_s,
        }


def median_ttft(samples: Iterable[Sample]) -> tuple[list[int], list[float]]:
    """The median TTFT of each prompt size, sizes ascending."""
    by_size: dict[int, list[float]] = {}
    for s in samples:
        if s.input_tokens and s.ttft_ms is not None:
            by_size.setdefault(s.input_tokens, []).append(s.ttft_ms)
    xs = sorted(by_size)
    return xs, [statistics.median(by_size[x]) for x in xs]


def _input_row(results: BenchResults, s: Sample) -> dict[str, Any]:
    floor = None
    if s.label == "local" and s.input_tokens is not None:
        floor = results.floor_ms(s.input_tokens)
    return {
        "engine": s.label,
        "input_tokens": s.input_tokens,
        "ttft_ms": s.ttft_ms,
        "floor_ms": floor,
        "tpot_ms": s.tpot_ms,
    }


def _concurrency_row(p: ConcurrencyPoint) -> dict[str, Any]:
    return {**asdict(p), "throughput_tps": p.throughput_tps}


def total_check(samples: Sequence[Sample]) -> dict[str, Any]:
    """Measured total time against TTFT + TPOT x (tokens - 1): the relative errors."""
    errors = [
        (s.total_ms - p) / s.total_ms
        for s in samples
        if (p := s.predicted_total_ms) is not None and s.total_ms
    ]
    if not errors:
        return {"requests": 0, "median_error": None, "max_abs_error": None}
    return {
        "requests": len(errors),
        "median_error": statistics.median(errors),
        "max_abs_error": max(abs(e) for e in errors),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def input_table(results: BenchResults) -> Table:
    table = _table(
        "TTFT against input length",
        ("engine", "input tokens", "TTFT ms", "local floor ms", "TPOT ms", "output tokens"),
    )
    for row in _input_row_cells(results):
        table.add_row(*row)
    return table


def _input_row_cells(results: BenchResults) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for s in results.part("input"):
        floor = results.floor_ms(s.input_tokens or 0) if s.label == "local" else None
        rows.append(
            (
                s.label,
                str(s.input_tokens or "-"),
                _ms(s.ttft_ms),
                _ms(floor),
                _ms(s.tpot_ms),
                str(s.output_tokens),
            )
        )
    return rows


def concurrency_table(results: BenchResults) -> Table:
    head = ("concurrency", "TTFT P50 ms", "TPOT P50 ms", "tokens", "wall s", "tokens/s")
    table = _table("cloud: TPOT and throughput against concurrency", head)
    for p in results.concurrency:
        table.add_row(
            str(p.concurrency),
            _ms(p.ttft_p50_ms),
            _ms(p.tpot_p50_ms),
            str(p.output_tokens),
            f"{p.wall_s:.2f}",
            f"{p.throughput_tps:.1f}",
        )
    return table


def strategy_table(results: BenchResults) -> Table:
    head = (
        "strategy",
        "requests",
        "cloud share",
        "cloud started",
        "TTFT P50",
        "TTFT P95",
        "TTFT P99",
        "TPOT P50",
        "failures",
    )
    table = _table("mixed workload: TTFT (ms) per routing strategy (client.stats())", head)
    for run in results.strategies:
        g = run.overall
        share = "-" if g.counts.cloud_share is None else f"{g.counts.cloud_share * 100:.0f}%"
        table.add_row(
            run.name,
            str(g.counts.requests),
            share,
            str(g.counts.cloud_started),
            _ms(g.ttft_ms.p50),
            _ms(g.ttft_ms.p95),
            _ms(g.ttft_ms.p99),
            _ms(g.tpot_ms.p50),
            str(g.counts.failures),
        )
    return table


def check_line(results: BenchResults) -> str:
    check = total_check(results.samples)
    if not check["requests"]:
        return "total time check: no request with two tokens or more"
    return (
        f"total time = TTFT + TPOT x (tokens - 1): median error {check['median_error']:+.1%}, "
        f"largest {check['max_abs_error']:.1%} over {check['requests']} requests"
    )


def _table(title: str, head: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(head):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    return table
