"""Replay recorded real traces through the latency model: predicted vs observed TTFT.

    python benchmarks/bench_latency_model.py [benchmarks/traces/real.jsonl] [--json PATH]

For each request in recorded order: predict its TTFT (from the client's prompt-token estimate,
less the prefix shared with the previous local prompt for the local engine, the output tokens
and the local queue wait the engine reported at the call), then learn from its trace, as
`HybridClient` does. Reports the median and p90 absolute TTFT error per engine, for:

- latency model: `LatencyModel` seeded with the local engine's warm-up figures (the client's);
- latency model without drift: the same with the short-window drift check turned off;
- engine's own estimate: `LlamaCppEngine.predict_ttft_s` at the call (local only);
- running median: the median of that engine's past TTFTs (no length, no queue: the baseline).

The cloud is also reported per phase ("steady" and "slower": the recording adds 600 ms to every
cloud first byte in its second half), with the number of slower requests the model needed
before its prediction moved past the midpoint between the two phases' medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridllm.runtime.gather import prompt_text, uncached_share
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import Trace

Row = dict[str, Any]


def load(path: Path) -> tuple[Row, list[Row]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    head, rows = lines[0], [r for r in lines[1:] if r.get("ttft_ms") is not None]
    return head, rows


def trace_of(row: Row) -> Trace:
    tr = Recorder(Trace(t_start=0.0, engine=row["engine"], started=(row["engine"],)))
    for name, ms in row["marks_ms"].items():
        if name not in ("first_token", "done"):
            tr.mark(name, ms / 1000.0)
    first = row["ttft_ms"] / 1000.0
    tpot = (row.get("tpot_ms") or 0.0) / 1000.0
    for i in range(max(1, row.get("n_tokens") or 1)):
        tr.token(first + i * tpot)
    tr.done("stop", row["marks_ms"].get("done", row["ttft_ms"]) / 1000.0)
    tr.usage(row.get("prompt_tokens"), 0, row.get("cached_prompt_tokens"), False)
    return tr.freeze()


@dataclass
class Errors:
    by_key: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, key: tuple[str, str], predicted_s: float | None, observed_ms: float) -> None:
        if predicted_s is not None:
            self.by_key.setdefault(key, []).append(abs(predicted_s * 1e3 - observed_ms))


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else float("nan")


def model_for(head: Row, drift: bool) -> LatencyModel:
    model = LatencyModel()
    warm = head.get("warm_up") or {}
    if warm.get("prefill_tps"):
        model.seed(
            "local",
            prefill_tps=warm["prefill_tps"],
            tpot_s=warm.get("tpot_s"),
            overhead_s=warm.get("tpot_s"),
        )
    if not drift:
        for name in ("local", "cloud"):
            model.engine(name).short = 10**9
    return model


def replay(head: Row, rows: list[Row]) -> dict[str, Any]:
    errs = Errors()
    models = {"latency model": model_for(head, True), "without drift": model_for(head, False)}
    past: dict[str, list[float]] = {}
    noticed: dict[str, int | None] = {}
    cloud_steady = [r["ttft_ms"] for r in rows if r["engine"] == "cloud" and r["phase"] == "steady"]
    cloud_slow = [r["ttft_ms"] for r in rows if r["engine"] == "cloud" and r["phase"] == "slower"]
    mid = None
    if cloud_steady and cloud_slow:
        mid = (statistics.median(cloud_steady) + statistics.median(cloud_slow)) / 2
    slow_seen = 0
    last_local: str | None = None
    for row in rows:
        eng, obs = row["engine"], row["ttft_ms"]
        n, queue = row["prompt_tokens_est"], row.get("expected_wait_s") or 0.0
        fresh = float(n)
        if eng == "local" and "prompt" in row:  # what the client knows of the KV cache
            text = prompt_text([{"role": "user", "content": row["prompt"]}])
            fresh = n * uncached_share(text, last_local)
            last_local = text
        phase = row["phase"] if eng == "cloud" else "all"
        for label, model in models.items():
            p = model.predict(eng, fresh, 8, queue_s=queue if eng == "local" else 0.0)
            errs.add((eng, label), p.ttft_s, obs)
            if eng == "cloud":
                errs.add((f"{eng}:{phase}", label), p.ttft_s, obs)
            if eng == "cloud" and phase == "slower" and mid is not None and label not in noticed:
                if p.ttft_s * 1e3 > mid:
                    noticed[label] = slow_seen
            model.observe_trace(trace_of(row), n)
        own = row.get("engine_predicted_ttft_s")
        errs.add((eng, "engine's own estimate"), own, obs)
        hist = past.setdefault(eng, [])
        med = statistics.median(hist) / 1e3 if hist else None
        errs.add((eng, "running median"), med, obs)
        if eng == "cloud":
            errs.add((f"{eng}:{phase}", "running median"), med, obs)
        hist.append(obs)
        if eng == "cloud" and phase == "slower":
            slow_seen += 1
    table = []
    for (group, label), xs in sorted(errs.by_key.items()):
        observed = [r["ttft_ms"] for r in rows if _in_group(r, group)]
        table.append(
            {
                "group": group,
                "predictor": label,
                "n": len(xs),
                "median_abs_err_ms": statistics.median(xs),
                "p90_abs_err_ms": pct(xs, 0.9),
                "median_observed_ms": statistics.median(observed) if observed else None,
            }
        )
    return {
        "warm_up": head.get("warm_up"),
        "rows": table,
        "slower_requests_before_noticed": {k: noticed.get(k) for k in models},
        "cloud_phase_medians_ms": {
            "steady": statistics.median(cloud_steady) if cloud_steady else None,
            "slower": statistics.median(cloud_slow) if cloud_slow else None,
        },
    }


def _in_group(row: Row, group: str) -> bool:
    eng, _, phase = group.partition(":")
    return row["engine"] == eng and (not phase or phase == "all" or row["phase"] == phase)


def render(res: dict[str, Any]) -> str:
    out = [
        f"warm-up: {res['warm_up']}",
        f"{'group':<14} {'predictor':<22} {'n':>4} {'med |err| ms':>13} {'p90 |err| ms':>13} "
        f"{'med TTFT ms':>12}",
    ]
    fmt: Callable[[float | None], str] = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    for r in res["rows"]:
        out.append(
            f"{r['group']:<14} {r['predictor']:<22} {r['n']:>4} {fmt(r['median_abs_err_ms']):>13} "
            f"{fmt(r['p90_abs_err_ms']):>13} {fmt(r['median_observed_ms']):>12}"
        )
    out.append(f"cloud phase medians (ms): {res['cloud_phase_medians_ms']}")
    out.append(f"slower cloud requests seen before the prediction moved past the midpoint: "
               f"{res['slower_requests_before_noticed']}")  # fmt: skip
    return "\n".join(out)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", default="benchmarks/traces/real.jsonl")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args()
    head, rows = load(Path(args.path))
    if not rows:
        sys.exit(f"no traces in {args.path}")
    res = replay(head, rows)
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    cli()
