"""`hybridllm stats`: percentiles and counts of the decision log's last hour, day or week.

    hybridllm stats --log decisions.db                 # the last day, as a table
    hybridllm stats --log decisions.db --since 1h --json
    hybridllm stats --log decisions.db --since 7d --plot ttft.png
    hybridllm stats --log redis://log.internal:6379/0  # the log several gateways share

Each logged request (one row of `hybridllm.routing.log.DecisionLog`, or of the
`RedisDecisionLog` several gateways share) goes through the same aggregator as
`HybridClient.stats()` (`telemetry.stats.Stats`, DDSketch at 0.5% relative accuracy), by way of
its trace (`telemetry.logged`): overall, per policy and per serving engine.
Rows logged before the log kept traces count with their TTFT only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TextIO

from hybridllm.cli.stats_log import aggregate, read_log
from hybridllm.stores.redis_urls import redact_url
from hybridllm.telemetry.stats import GroupStats, StatsReport

UNIT_S = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SINCE = re.compile(r"(\d+)([mhdw])")


def since_seconds(text: str) -> float:
    """argparse type of `--since`: N followed by m, h, d or w ("1h", "1d", "7d")."""
    match = _SINCE.fullmatch(text.strip())
    if match is None or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a count >= 1 and a unit m, h, d or w (1h, 1d, 7d), not {text!r}"
        )
    return int(match.group(1)) * UNIT_S[match.group(2)]


HEAD = (
    "group",
    "requests",
    "failures",
    "fallbacks",
    "cloud share",
    "TTFT P50",
    "TTFT P95",
    "TTFT P99",
    "TPOT P50",
    "TPOT P99",
    "ITL P99",
    "hop P99",
)


def table_rows(report: StatsReport) -> list[tuple[str, ...]]:
    """One row per group: overall, each policy, each engine (milliseconds)."""
    groups = [("all", report.overall)]
    groups += [(f"policy {k}", v) for k, v in sorted(report.policies.items())]
    groups += [(f"engine {k}", v) for k, v in sorted(report.engines.items())]
    return [_row(name, g) for name, g in groups]


def _row(name: str, g: GroupStats) -> tuple[str, ...]:
    c = g.counts
    share = "-" if c.cloud_share is None else f"{c.cloud_share * 100:.0f}%"
    return (
        name,
        str(c.requests),
        str(c.failures),
        str(c.fallbacks),
        share,
        _ms(g.ttft_ms.p50),
        _ms(g.ttft_ms.p95),
        _ms(g.ttft_ms.p99),
        _ms(g.tpot_ms.p50),
        _ms(g.tpot_ms.p99),
        _ms(g.itl_ms.p99),
        _ms(g.hop_ms.p99),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(report: StatsReport, title: str, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, name in enumerate(HEAD):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in table_rows(report):
        table.add_row(*row)
    Console(file=out, width=max(160, len(title))).print(table)


def run_stats(args: argparse.Namespace) -> int:
    """The `hybridllm stats` command (see the module docstring)."""
    requests = read_log(args.log, args.since)
    report = aggregate(requests, args.since)
    shown = redact_url(args.log)  # a Redis URL's password is never printed
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        span = _span(args.since)
        print_table(
            report,
            f"{shown}: {len(requests)} requests in the last {span} (times in ms)",
            sys.stdout,
        )
    if args.plot:
        from hybridllm.cli.stats_plot import ttft_over_time

        path = ttft_over_time(requests, args.since, Path(args.plot), shown)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
