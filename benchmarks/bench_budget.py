"""Budget ledger benchmark: what reserve() and settle() add to a cloud request.

    python benchmarks/bench_budget.py [--n 500] [--procs 4] [--json PATH]

A ledger file in WAL mode in a temporary directory, one day cap and one per-scope cap. Figures:
p50 / p99 milliseconds of `reserve` and `settle` from one process, then with `--procs` processes
reserving and settling on the same file at once. Baseline, in the same run: a bare SQLite
`BEGIN IMMEDIATE; INSERT; COMMIT` on a file of the same kind (the least a correct cross-process
ledger pays).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybridllm.guard.budget import Cap, ModelPrice, SQLiteLedger, TokenUsage  # noqa: E402

PRICE = ModelPrice(input_per_million=0.15, output_per_million=0.6)
CAPS = [Cap(None, "day", 1e6), Cap("chat", "day", 1e6)]


def cycle(path: str, n: int) -> dict[str, list[float]]:
    ledger = SQLiteLedger(path)
    res, sett = [], []
    for _ in range(n):
        t = time.perf_counter()
        r = ledger.reserve(
            model="m", price=PRICE, prompt_tokens=800, max_tokens=256, scope="chat", caps=CAPS
        )
        t2 = time.perf_counter()
        ledger.settle(r, TokenUsage(750, 120))
        t3 = time.perf_counter()
        res.append((t2 - t) * 1e3)
        sett.append((t3 - t2) * 1e3)
    ledger.close()
    return {"reserve": res, "settle": sett}


def baseline(path: str, n: int) -> list[float]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v INTEGER)")
    out = []
    for i in range(n):
        t = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (v) VALUES (?)", (i,))
        db.execute("COMMIT")
        out.append((time.perf_counter() - t) * 1e3)
    db.close()
    return out


def _worker(path: str, n: int, q: multiprocessing.Queue[dict[str, list[float]]]) -> None:
    q.put(cycle(path, n))


def q(ms: list[float]) -> str:
    p = statistics.quantiles(ms, n=100, method="inclusive")
    return f"p50 {p[49]:6.3f}  p99 {p[98]:6.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline(str(Path(tmp) / "base.db"), args.n)
        one = cycle(str(Path(tmp) / "one.db"), args.n)
        shared = str(Path(tmp) / "shared.db")
        SQLiteLedger(shared).close()
        ctx = multiprocessing.get_context("spawn")
        results: multiprocessing.Queue[dict[str, list[float]]] = ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(shared, args.n, results)) for _ in range(args.procs)
        ]
        for p in procs:
            p.start()
        many = [results.get() for _ in procs]
        for p in procs:
            p.join()
        with SQLiteLedger(shared) as ledger:
            n_settled = sum(e["state"] == "settled" for e in ledger.entries())
    multi = {k: [x for m in many for x in m[k]] for k in ("reserve", "settle")}
    print(f"n={args.n} per process; times in ms")
    print(f"baseline BEGIN IMMEDIATE/INSERT/COMMIT  {q(base)}")
    print(f"reserve, 1 process                      {q(one['reserve'])}")
    print(f"settle,  1 process                      {q(one['settle'])}")
    print(f"reserve, {args.procs} processes on one file        {q(multi['reserve'])}")
    print(f"settle,  {args.procs} processes on one file        {q(multi['settle'])}")
    print(f"entries settled in the shared file: {n_settled} of {args.n * args.procs}")
    if args.json:
        out = {"baseline": base, "one": one, "multi": multi}
        args.json.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
