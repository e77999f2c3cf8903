"""Per-user and per-key budget caps (issue 46): what they add to reserve() and settle(), on
both ledgers.

    python benchmarks/bench_tenants.py [--n 2000] [--users 1000] [--keys 10] [--json PATH]

For each ledger (a SQLite file in WAL mode; a real `redis-server` on loopback, started here,
when the binary is installed), `--n` reserve + settle cycles from one process, interleaved
in rounds of 100 between two cap sets in the same run:
- "app caps": a global day cap and the policy's day cap (what a ledger held before);
- "+ per-user": the same, plus the policy's per-user day and month caps, the request's user
  drawn from `--users` ids (each reservation reads and moves the user's totals too);
- "+ per-user + key": that, billed to a tenant (a gateway key) drawn from `--keys`, with its
  day and month caps (the tenant's totals too).
Figures: p50 / p99 milliseconds of `reserve` and of `settle`, and the ratio of each p50 to the
app-caps p50 (the same ledger, the same run). No model is involved: this is the
ledger's own cost per cloud request.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import cpu_model  # noqa: E402
from hybridllm.guard.budget import (  # noqa: E402
    Cap,
    Ledger,
    ModelPrice,
    SQLiteLedger,
    TokenUsage,
    tenant_caps,
)
from hybridllm.policy import Tenant  # noqa: E402

PRICE = ModelPrice(input_per_million=0.15, output_per_million=0.6)
APP = [Cap(None, "day", 1e6), Cap("chat", "day", 1e6)]
PER_USER = [*APP, Cap("chat", "day", 1e3, per_user=True), Cap("chat", "month", 1e4, per_user=True)]
ROUND = 100


Who = tuple[str | None, Tenant | None]  # the end user, the tenant


def cycles(ledger: Ledger, caps: list[Cap], whos: list[Who], out: dict[str, list[float]]) -> None:
    for user, tenant in whos:
        mine = caps + list(tenant_caps(tenant))
        t = time.perf_counter()
        r = ledger.reserve(
            model="m",
            price=PRICE,
            prompt_tokens=800,
            max_tokens=256,
            scope="chat",
            caps=mine,
            user=user,
            tenant=None if tenant is None else tenant.name,
        )
        t2 = time.perf_counter()
        ledger.settle(r, TokenUsage(750, 120))
        t3 = time.perf_counter()
        out["reserve"].append((t2 - t) * 1e3)
        out["settle"].append((t3 - t2) * 1e3)


def run(
    ledger: Ledger, n: int, n_users: int, n_keys: int, seed: int = 0
) -> dict[str, dict[str, list[float]]]:
    rng = random.Random(seed)
    ids = [f"user-{i}" for i in range(n_users)]
    keys = [Tenant(f"key-{i}", day_usd=1e3, month_usd=1e4) for i in range(n_keys)]
    figures: dict[str, dict[str, list[float]]] = {
        name: {"reserve": [], "settle": []}
        for name in ("app caps", "+ per-user", "+ per-user + key")
    }
    nobody: list[Who] = [(None, None)] * ROUND
    cycles(ledger, APP, nobody[:20], {"reserve": [], "settle": []})  # warm-up, not counted
    for _ in range(n // ROUND):
        cycles(ledger, APP, nobody, figures["app caps"])
        users: list[Who] = [(rng.choice(ids), None) for _ in range(ROUND)]
        cycles(ledger, PER_USER, users, figures["+ per-user"])
        keyed: list[Who] = [(rng.choice(ids), rng.choice(keys)) for _ in range(ROUND)]
        cycles(ledger, PER_USER, keyed, figures["+ per-user + key"])
    return figures


def quantiles(ms: list[float]) -> tuple[float, float]:
    p = statistics.quantiles(ms, n=100, method="inclusive")
    return p[49], p[98]


def report(name: str, figures: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    base = {op: quantiles(figures["app caps"][op]) for op in ("reserve", "settle")}
    for caps, ops in figures.items():
        for op, ms in ops.items():
            p50, p99 = quantiles(ms)
            ratio = p50 / base[op][0]
            rows[f"{caps}/{op}"] = {"p50_ms": p50, "p99_ms": p99, "p50_ratio": ratio}
            print(f"| {name} | {caps} | {op} | {p50:.3f} | {p99:.3f} | {ratio:.2f}x |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="cycles per cap set and ledger")
    ap.add_argument("--users", type=int, default=1000, help="distinct end users drawn from")
    ap.add_argument("--keys", type=int, default=10, help="distinct tenants (keys) drawn from")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(
        f"CPU: {cpu_model()}; {args.n} cycles per cap set, "
        f"{args.users} users, {args.keys} keys, interleaved in rounds of {ROUND}"
    )
    print("| ledger | caps | op | p50 ms | p99 ms | p50 vs app caps |")
    print("|---|---|---|---|---|---|")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with SQLiteLedger(Path(tmp) / "ledger.db") as ledger:
            figures = run(ledger, args.n, args.users, args.keys)
            out["sqlite"] = report("SQLite (WAL file)", figures)
    from hybridllm.testing import RedisServer, find_redis_server

    if find_redis_server() is None:
        print("(no redis-server here: the Redis ledger is not measured)")
    else:
        from hybridllm.guard.budget_redis import RedisLedger

        with RedisServer() as server, RedisLedger(server.url) as ledger:
            out["redis"] = report("Redis (loopback)", run(ledger, args.n, args.users, args.keys))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
