"""Privacy scan benchmark: what the scan finds on the labelled corpus, and what it costs, with
main's code ("before") beside this checkout's ("after").

    python benchmarks/bench_privacy.py [--quick] [--n 100] [--before-ref main] [--json PATH]

Sets (labels: data/privacy/README.md), reported apart:
- "development": `data/privacy/corpus.jsonl`, the items the rules were written against (its
  issue-24 held-out items included: they have been seen since);
- "held-out": `data/privacy/heldout31.jsonl`, written after the issue-31 rules were frozen;
- "held-out 2": `data/privacy/heldout31b.jsonl`, written before the second pass's rules were
  frozen (the split numbers, German nouns, the longer list, the name test) and not run before;
- "held-out 3": `data/privacy/heldout31c.jsonl`, written before the third pass's rules (a name
  after a relation, phone grouping after a phone word) were frozen and not run before them;
- "held-out 4": `data/privacy/heldout31d.jsonl`, written after the rules were frozen at 7db531b.

`--judge-model PATH` adds the mode "+NER+judge" on the "after" side: an item whose only
finding is a name alone is asked of the privacy judge on that GGUF model (the name test,
`guard.privacy_known`; no time limit, so every verdict is measured), and cleared when every
name is known. It reports the judge's time per judged item (the TTFT it adds to such a request
bound for the cloud) and the bar's one-off measurement.

Per set, scan mode (patterns only; patterns + the NER layer) and language, before and after:
- recall per kind: the share of (item, expected kind) pairs whose kind was found (a national
  ID counts as `national_id`, `ssn`, `uk_nino` or `es_dni`);
- kept local: the share of private items on which anything was found (what
  `privacy="keep-local"` acts on: such a request stays on the device);
- FP benign, FP public: the share of benign items, and of public-figure questions, on which
  something was found (kept local without reason).
Cost: P50/P99 ms of one `PrivacyScanner.scan` on cloud-bound prompts of about 50 and 2,000 tokens
(benign prose, a new text each call so that no cache answers), patterns only and with NER.

"Before" is main's code exported with `git archive` into a temporary directory (the repository
is not touched); each side runs in its own process, one after the other, this same file with
`--worker` and the code's directory first on `sys.path`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
CODE = Path(os.environ.get("HYBRIDLLM_BENCH_CODE", HERE))
sys.path.insert(0, str(CODE))

SETS = {
    "development": HERE / "data" / "privacy" / "corpus.jsonl",
    "held-out": HERE / "data" / "privacy" / "heldout31.jsonl",
    "held-out 2": HERE / "data" / "privacy" / "heldout31b.jsonl",
    "held-out 3": HERE / "data" / "privacy" / "heldout31c.jsonl",
    "held-out 4": HERE / "data" / "privacy" / "heldout31d.jsonl",
}
SAME = {"national_id": {"national_id", "ssn", "uk_nino", "es_dni"}}
LANGS = ("all", "en", "fr", "de", "es", "it")
MODES = ("patterns", "+NER", "+NER+judge")
JUDGE = "HYBRIDLLM_BENCH_JUDGE_MODEL"  # set by --judge-model for the "after" side
Item = dict[str, Any]


def load(path: Path) -> list[Item]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


# ---- the worker: runs under the code being measured ------------------------------------------


def prose(tokens: int, benign: Sequence[str], salt: int) -> str:
    from hybridllm.engines.tokens import estimate_text_tokens

    parts, i = [f"Request {salt}."], salt
    while estimate_text_tokens(" ".join(parts)) < tokens:
        parts.append(benign[i % len(benign)])
        i += 7
    return " ".join(parts)


def latency(scanner: Any, tokens: int, n: int, benign: Sequence[str]) -> dict[str, float]:
    texts = [[{"role": "user", "content": prose(tokens, benign, s)}] for s in range(n + 5)]
    for t in texts[:5]:
        scanner.scan(t)
    ms = []
    for t in texts[5:]:
        t0 = time.perf_counter()
        scanner.scan(t)
        ms.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50": q[49], "p99": q[98]}


def worker(n: int) -> dict[str, Any]:
    """What the code on `sys.path` finds on each item, per mode, and its latencies."""
    from hybridllm.guard.privacy import kinds
    from hybridllm.guard.privacy_ner import PrivacyScanner

    scanners = {"patterns": PrivacyScanner(ner="off"), "+NER": PrivacyScanner(ner="on")}
    t0 = time.perf_counter()
    scanners["+NER"].warm()
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0, "found": {}, "latency": {}}
    for mode, scanner in scanners.items():
        out["found"][mode] = {
            item["id"]: list(kinds(scanner.scan(item["messages"])))
            for path in SETS.values()
            for item in load(path)
        }
    if os.environ.get(JUDGE):
        out["found"]["+NER+judge"], out["judge"] = judged(scanners["+NER"], os.environ[JUDGE])
    benign = [
        str(m["content"]) for i in load(SETS["development"]) if i["group"] == "benign"
        for m in i["messages"]
    ]  # fmt: skip
    for tokens in (50, 2000):
        for mode, scanner in scanners.items():
            out["latency"][f"{tokens} {mode}"] = latency(scanner, tokens, n, benign)
    return out


def judged(scanner: Any, model: str) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Each item's kinds after the judge's name test, and the judge's times."""
    import anyio

    from hybridllm.engines.llamacpp import LlamaCppEngine
    from hybridllm.guard.privacy import kinds
    from hybridllm.guard.privacy_judge import PrivacyJudge, person_names

    async def run() -> tuple[dict[str, list[str]], dict[str, Any]]:
        engine = LlamaCppEngine(model, n_ctx=1024, n_threads=2)
        await engine.start()
        judge = PrivacyJudge(engine, budget_s=600)
        assert judge.names is not None
        t0 = time.perf_counter()
        bar = await judge.names.bar()
        times: dict[str, Any] = {"bar": bar, "bar_s": time.perf_counter() - t0, "ms": []}
        out: dict[str, list[str]] = {}
        for path in SETS.values():
            for item in load(path):
                found = scanner.scan(item["messages"])
                out[item["id"]] = list(kinds(found))
                if set(out[item["id"]]) != {"person"}:
                    continue
                sent = [(f"messages[{i}].content", m["content"]) for i, m in
                        enumerate(item["messages"])]  # fmt: skip
                t1 = time.perf_counter()
                verdict = await judge.verdict([t for _, t in sent], names=person_names(found, sent))
                times["ms"].append((time.perf_counter() - t1) * 1e3)
                if not verdict.private:
                    out[item["id"]] = []
        await engine.aclose()
        return out, times

    return anyio.run(run)


# ---- the report --------------------------------------------------------------------------------


def hit(expected: str, found: set[str]) -> bool:
    return bool(SAME.get(expected, {expected}) & found)


def tally(items: list[Item], found: dict[str, list[str]]) -> dict[str, Counter[str]]:
    """lang -> counters: "k:KIND" hits and "k:KIND/n"; "g:GROUP" flagged and "g:GROUP/n"."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for item in items:
        got = set(found[item["id"]])
        group = "private" if item["group"] in ("sensitive", "split") else item["group"]
        for lang in ("all", item["lang"]):
            c = out[lang]
            c[f"g:{group}/n"] += 1
            c[f"g:{group}"] += bool(got)
            for k in item["kinds"]:
                c[f"k:{k}/n"] += 1
                c[f"k:{k}"] += hit(k, got)
    return out


def share(c: Counter[str], key: str) -> str:
    n = c[key + "/n"]
    return f"{c[key] / n:4.0%} {c[key]:>2}/{n:<2}" if n else "-"


def report_set(name: str, items: list[Item], runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"\n== {name} ({len(items)} items: {dict(Counter(i['group'] for i in items))})"]
    langs = [lang for lang in LANGS if lang == "all" or any(i["lang"] == lang for i in items)]
    kinds_ = sorted({k for i in items for k in i["kinds"]})
    rows = [(f"recall {k}", f"k:{k}") for k in kinds_]
    rows += [("kept local (private)", "g:private"), ("FP benign", "g:benign")]
    rows += [("FP public figures", "g:public")]
    for mode in MODES:
        lines.append(f"-- {mode}: before -> after")
        lines.append(f"{'':22}" + "".join(f"{lang:>26}" for lang in langs))
        if mode not in runs["after"]["found"]:
            continue
        tallies = {
            side: tally(items, run["found"].get(mode, run["found"]["+NER"]))
            for side, run in runs.items()
        }
        for label, key in rows:
            cells = []
            for lang in langs:
                b, a = (share(tallies[side][lang], key) for side in ("before", "after"))
                cells.append(f"{b} -> {a}" if a != "-" else "-")
            lines.append(f"{label:22}" + "".join(f"{c:>26}" for c in cells))
    return lines


def missed(items: list[Item], found: dict[str, list[str]]) -> list[str]:
    out = []
    for item in items:
        got = set(found[item["id"]])
        if item["group"] in ("benign", "public") and got:
            out.append(f"{item['id']}: flagged {sorted(got)}")
        out += [f"{item['id']}: missed {k}" for k in item["kinds"] if not hit(k, got)]
    return out


def run_side(code: Path, n: int, judge_model: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "HYBRIDLLM_BENCH_CODE": str(code), "PYTHONPATH": str(code)}
    env.pop(JUDGE, None)
    if judge_model:
        env[JUDGE] = judge_model
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, "--worker", "--n", str(n), "--json", f.name]
        subprocess.run(cmd, env=env, check=True, stderr=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(Path(f.name).read_text())
        return result


def export(ref: str, into: Path) -> None:
    """`ref`'s hybridllm package, exported with `git archive` (the repository is not touched)."""
    archive = subprocess.run(
        ["git", "-C", str(HERE), "archive", ref, "hybridllm"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer latency samples (n=30)")
    ap.add_argument("--n", type=int, default=100, help="latency samples per figure")
    ap.add_argument("--before-ref", default="main", help="the git ref measured as 'before'")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--judge-model", help="a GGUF file: add the judge's name test (after only)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = 30 if args.quick else args.n
    if args.worker:
        args.json.write_text(json.dumps(worker(n)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        export(args.before_ref, Path(tmp))
        runs = {"before": run_side(Path(tmp), n), "after": run_side(HERE, n, args.judge_model)}
    lines = [f"before: {args.before_ref} (git archive); after: {HERE}"]
    for name, path in SETS.items():
        items = load(path)
        lines += report_set(name, items, runs)
        for mode in ("+NER", "+NER+judge"):
            if mode in runs["after"]["found"]:
                lines.append(f"-- after, {mode}, what is still wrong in the {name} set:")
                lines += [f"   {m}" for m in missed(items, runs["after"]["found"][mode])]
    lines.append(f"\nlatency of one scan, n={n}, P50 / P99 ms (before -> after)")
    for key in runs["after"]["latency"]:
        b, a = runs["before"]["latency"][key], runs["after"]["latency"][key]
        lines.append(
            f"  ~{key:16} p50 {b['p50']:7.2f} -> {a['p50']:7.2f}   "
            f"p99 {b['p99']:7.2f} -> {a['p99']:7.2f}"
        )
    if "judge" in runs["after"]:
        j = runs["after"]["judge"]
        ms = sorted(j["ms"]) or [0.0]
        q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
        lines.append(
            f"judge (name test, {args.judge_model}): {len(j['ms'])} items judged; added TTFT "
            f"P50 {q[49]:.0f} ms, P99 {q[98]:.0f} ms; bar {j['bar']:.2f} measured once in "
            f"{j['bar_s']:.1f} s"
        )
    load_s = {side: f"{run['load_s']:.2f} s" for side, run in runs.items()}
    lines.append(f"NER layer load, once per process: {load_s}")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
