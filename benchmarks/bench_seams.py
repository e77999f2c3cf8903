"""Seams, graded (issue 43): fixed sequences joined by a handoff, exact or not, per dialect.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_seams.py [--after 3 6] [--json PATH]
        [--dialects continue_final_message trailing_assistant instruction auto]

Each prompt's right answer is a fixed sequence (counting, letters, days, months, a countdown,
primes, multiples). The local engine is Qwen2.5-Coder 0.5B through llama-cpp-python. The stand-in
cloud is `hybridllm serve-model` on loopback, serving the same model. Each runs one thread, and
both share this machine's two cores.

Per prompt, greedy decoding, max_tokens 100:
- the cloud alone and the local engine alone (the references);
- `plan="handoff"` after `--after` local tokens, the cloud continuing in each dialect
  (`OpenAIEngine(continuation=...)`; "auto" probes).

A joined answer is exact when its items (words and numbers, in order) begin with the whole
sequence: nothing doubled, skipped or restarted at the seam. Reported per row:
- the share exact, beside the references (target: at least 95% as often as the serving engine
  alone);
- the seams the check cut, by kind (`Trace.seams`);
- the hold the check added at the seam (P50 / P95 ms).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from typing import Any

import anyio

from benchmarks._report import cpu_model, report
from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer

API_KEY, ALIAS = "sk-bench", "cloud"
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = (
    "january february march april may june july august september october november december"
).split()
SEQUENCES: list[tuple[str, list[str]]] = [
    ("Count from 1 to 20, separated by commas.", [str(i) for i in range(1, 21)]),
    ("Count down from 20 to 1, separated by commas.", [str(i) for i in range(20, 0, -1)]),
    (
        "List the letters of the alphabet from A to P, separated by spaces.",
        list("abcdefghijklmnop"),
    ),
    ("Name the days of the week from Monday to Sunday, separated by commas.", DAYS),
    ("Name the months of the year from January to December, separated by commas.", MONTHS),
    ("List the first 10 prime numbers, separated by commas.", "2 3 5 7 11 13 17 19 23 29".split()),
    (
        "Write the multiples of 7 from 7 to 70, separated by commas.",
        [str(7 * i) for i in range(1, 11)],
    ),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def exact(text: str, expected: list[str]) -> bool:
    """The answer's items (words, numbers) begin with the whole expected sequence."""
    items = [w.lower() for w in re.findall(r"[A-Za-z]+|\d+", text)]
    start = items.index(expected[0]) if expected[0] in items else 0  # "Sure: 1, 2, ..."
    return items[start : start + len(expected)] == expected


async def one(client: HybridClient, prompt: str, **kw: Any) -> tuple[str, Any]:
    async with client.stream(prompt, **kw) as s:
        text = "".join([e.text async for e in s.events() if isinstance(e, Token)])
    return text, s.trace


def row(name: str, results: list[tuple[bool, Any]]) -> dict[str, Any]:
    seams = [r for _, t in results for r in t.seams]
    held = sorted(r.held_ms for r in seams) or [0.0]
    kinds = {k: sum(r.kind == k for r in seams) for k in ("clean", "overlap", "restart")}
    failed = sum(t.error is not None for _, t in results)
    return {
        "plan": name,
        "n": len(results),
        "exact": sum(ok for ok, _ in results),
        "failed": failed,
        "seams": kinds,
        "held_p50_ms": round(statistics.median(held), 1),
        "held_p95_ms": round(held[min(len(held) - 1, int(0.95 * len(held)))], 1),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    pol = Policy(
        name="seams",
        routing={"prefer": "local", "retries": 0, "stall_ms": 20000},
        sampling={"max_tokens": 100, "temperature": 0},
    )
    rows: list[dict[str, Any]] = []
    with HybridServer(path, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as srv:
        local = LlamaCppEngine(path, n_ctx=2048, n_threads=1)
        for dialect in args.dialects:
            cloud = OpenAIEngine(
                base_url=srv.url + "/v1", api_key=API_KEY, model=ALIAS, continuation=dialect
            )
            async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
                plans: list[tuple[str, dict[str, Any]]] = []
                if dialect == args.dialects[0]:
                    plans += [
                        ("cloud alone", {"engine": "cloud"}),
                        ("local alone", {"engine": "local"}),
                    ]
                for after in args.after:
                    name = f"handoff after {after}, {dialect}"
                    kw = {"plan": "handoff", "policy": pol.with_(handoff={"after_tokens": after})}
                    plans.append((name, kw))
                for name, kw in plans:
                    results = []
                    for prompt, expected in SEQUENCES:
                        text, trace = await one(client, prompt, **kw)
                        results.append((exact(text, expected), trace))
                        log(f"  {name}: {exact(text, expected)} {text[:70]!r}")
                    rows.append(row(name, results))
    return {"cpu": cpu_model(), "rows": rows}


def render(res: dict[str, Any]) -> str:
    lines = [
        f"CPU: {res['cpu']}",
        "",
        f"{'plan':<38} exact  failed  seams clean/overlap/restart  hold P50/P95 ms",
    ]
    for r in res["rows"]:
        s = r["seams"]
        lines.append(
            f"{r['plan']:<38} {r['exact']:>2}/{r['n']:<3} {r['failed']:>5}   "
            f"{s['clean']}/{s['overlap']}/{s['restart']:<24} "
            f"{r['held_p50_ms']} / {r['held_p95_ms']}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--after", type=int, nargs="+", default=[3, 6])
    ap.add_argument(
        "--dialects",
        nargs="+",
        default=["continue_final_message", "trailing_assistant", "instruction", "auto"],
    )
    ap.add_argument("--json")
    report(anyio.run(run, ap.parse_args()), render, ap.parse_args().json)


if __name__ == "__main__":
    main()
