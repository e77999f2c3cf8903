"""The privacy judge (issue 31, part 2) on the corpus: what the local model's verdicts change,
and what they cost.

    python benchmarks/bench_privacy_judge.py [--model qwen2.5-coder-1.5b-instruct] [--threads 2]

For every item of the development and held-out sets (`bench_privacy.SETS`), the fast layers
(patterns + NER) scan it; a borderline item (`privacy_judge.borderline`) is judged by the real
local model (llama-cpp-python, grammar-constrained JSON verdict, no time limit here so that
every verdict is measured). Reported per set:
- how many items are borderline, per case and group (only those pay for the judge);
- kept local / false positives with the fast layers alone, with the judge (fragments and
  lower-case names: a "private" verdict keeps the request local), and with the judge that also
  clears names (`clears_names=True`: a "not private" verdict on a name alone lets it go);
- the judge's time per verdict, P50 / P99: the TTFT it adds to a borderline cloud-bound request
  (the cloud request waits for it), and what `borderline` itself costs on every other request.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import anyio  # noqa: E402
from bench_privacy import SETS, load  # noqa: E402

from hybridllm import LlamaCppEngine  # noqa: E402
from hybridllm.guard.privacy import kinds  # noqa: E402
from hybridllm.guard.privacy_judge import PrivacyJudge, borderline  # noqa: E402
from hybridllm.guard.privacy_ner import PrivacyScanner  # noqa: E402
from hybridllm.local.resolve import resolve_model  # noqa: E402

Item = dict[str, Any]


def contents(item: Item) -> list[str]:
    return [str(m["content"]) for m in item["messages"]]


async def judge_all(judge: PrivacyJudge, items: list[Item], scanner: PrivacyScanner) -> list[Item]:
    """Per item: the fast layers' kinds, its borderline case, and the verdict (if borderline)."""
    rows = []
    for item in items:
        found = kinds(scanner.scan(item["messages"]))
        case = borderline(contents(item), found)
        verdict = await judge.verdict(contents(item)) if case else None
        rows.append({"item": item, "found": found, "case": case, "verdict": verdict})
    return rows


def kept(row: Item, mode: str) -> bool:
    """Whether the request stays local: fast layers alone, + judge, + judge clearing names."""
    fast = bool(row["found"])
    v = row["verdict"]
    if mode == "fast" or v is None:
        return fast
    if row["case"] == "name_alone":
        return bool(v.private) if mode == "clears" else True
    return bool(v.private)  # nothing found: the judge decides


def rate(rows: list[Item], groups: tuple[str, ...], mode: str) -> str:
    chosen = [r for r in rows if r["item"]["group"] in groups]
    n = sum(kept(r, mode) for r in chosen)
    return f"{n / len(chosen):5.0%} ({n}/{len(chosen)})" if chosen else "-"


def report(name: str, rows: list[Item]) -> None:
    print(f"\n== {name}: {len(rows)} items")
    cases = Counter((r["case"], r["item"]["group"]) for r in rows if r["case"])
    print("borderline (case, group): " + ", ".join(f"{c}/{g} {n}" for (c, g), n in cases.items()))
    print(f"{'':34}{'fast layers':>16}{'+ judge':>16}{'+ judge clears':>16}")
    for label, groups in (
        ("kept local, private", ("sensitive", "split")),
        ("kept local, benign (FP)", ("benign",)),
        ("kept local, public figures (FP)", ("public",)),
    ):
        cells = "".join(f"{rate(rows, groups, m):>16}" for m in ("fast", "judge", "clears"))
        print(f"{label:34}{cells}")
    for r in rows:
        v, item = r["verdict"], r["item"]
        if v is not None:
            print(f"   {item['id']:28} {r['case']:10} private={v.private!s:5} {v.seconds:5.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    scanner = PrivacyScanner(ner="on")
    scanner.warm()
    engine = LlamaCppEngine(resolve_model(args.model), n_ctx=2048, n_threads=args.threads)

    async def run() -> dict[str, list[Item]]:
        await engine.start()
        try:
            judge = PrivacyJudge(engine, budget_s=600)
            return {
                name: await judge_all(judge, load(path), scanner) for name, path in SETS.items()
            }
        finally:
            await engine.aclose()

    results = anyio.run(run)
    print(f"judge: {args.model}, {args.threads} threads")
    for name, rows in results.items():
        report(name, rows)
    seconds = [r["verdict"].seconds for rows in results.values() for r in rows if r["verdict"]]
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    print(f"\njudge time per verdict (the TTFT it adds to a borderline request), n={len(seconds)}:")
    print(f"  P50 {q[49] * 1e3:.0f} ms, P99 {q[98] * 1e3:.0f} ms")
    texts = [contents(i) for path in SETS.values() for i in load(path)]
    t0 = time.perf_counter()
    for t in texts:
        borderline(t, [])
    per = (time.perf_counter() - t0) / len(texts) * 1e3
    print(f"borderline() on every cloud-bound request: {per:.3f} ms per prompt")


if __name__ == "__main__":
    main()
