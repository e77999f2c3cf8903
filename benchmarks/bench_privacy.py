"""Privacy scan benchmark: what it finds on the labelled corpus, and what it costs per prompt.

    python benchmarks/bench_privacy.py [--quick] [--n 200] [--json PATH]

Quality, on `data/privacy/corpus.jsonl` (labels: data/privacy/README.md), for the patterns
alone ("before") and patterns + the NER layer ("after"), per language:
- recall per kind: the share of (item, expected kind) pairs whose kind was found (a national
  ID counts when found as `national_id`, `ssn`, `uk_nino` or `es_dni`);
- kept local: the share of items with personal data on which anything at all was found (what
  `privacy="keep-local"` acts on: such a request does not go to the cloud);
- false positives: the share of benign items flagged, and of items naming public figures
  (labelled benign: see the README) flagged.
The "held-out" column is the 31 items written after the rules were frozen (the others were
written alongside them, so their figures flatter the rules).
The NER layer runs in both of its language modes: the language detected (the default) and
every pipeline on every text.

Cost, on cloud-bound prompts of about 50 and 2,000 tokens (benign prose from the corpus, each
call a new text so that the NER layer's result cache never answers): P50/P99 milliseconds of
`PrivacyScanner.scan` with patterns only and with the NER layer, plus the one-time load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hybridllm.engines.tokens import estimate_text_tokens  # noqa: E402
from hybridllm.guard.privacy import kinds  # noqa: E402
from hybridllm.guard.privacy_ner import PrivacyScanner  # noqa: E402

CORPUS = ROOT / "data" / "privacy" / "corpus.jsonl"
SAME = {"national_id": {"national_id", "ssn", "uk_nino", "es_dni"}}


def load() -> list[dict[str, object]]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]


def hit(expected: str, found: set[str]) -> bool:
    return bool(SAME.get(expected, {expected}) & found)


def evaluate(items: list[dict[str, object]], scanner: PrivacyScanner) -> dict[str, object]:
    per_kind: dict[str, Counter[str]] = defaultdict(Counter)  # lang -> kind -> hits / total
    flagged: dict[str, Counter[str]] = defaultdict(Counter)  # lang -> group -> flagged / total
    missed: list[str] = []
    for item in items:
        lang, group = str(item["lang"]), str(item["group"])
        expected = list(item["kinds"])  # type: ignore[call-overload]
        found = set(kinds(scanner.scan(item["messages"])))  # type: ignore[arg-type]
        buckets = (lang, "all", "held-out") if item.get("heldout") else (lang, "all")
        for bucket in buckets:
            flagged[bucket][group + "/n"] += 1
            flagged[bucket][group] += bool(found)
            for k in expected:
                per_kind[bucket][k + "/n"] += 1
                per_kind[bucket][k] += hit(k, found)
        missed += [f"{item['id']}: {k}" for k in expected if not hit(k, found)]
    return {"kinds": per_kind, "flagged": flagged, "missed": missed}


def share(c: Counter[str], key: str) -> str:
    n = c[key + "/n"]
    return f"{c[key] / n:6.0%} ({c[key]}/{n})" if n else "     -"


def report(name: str, result: dict[str, object]) -> None:
    per_kind: dict[str, Counter[str]] = result["kinds"]  # type: ignore[assignment]
    flagged: dict[str, Counter[str]] = result["flagged"]  # type: ignore[assignment]
    print(f"\n== {name}")
    langs = ["all", "en", "fr", "de", "es", "held-out"]
    print(f"{'':22}" + "".join(f"{lang:>16}" for lang in langs))
    kind_names = sorted({k[:-2] for c in per_kind.values() for k in c if k.endswith("/n")})
    for k in kind_names:
        print(f"recall {k:15}" + "".join(f"{share(per_kind[lang], k):>16}" for lang in langs))
    for label, group in (("kept local", None), ("FP benign", "benign"), ("FP public", "public")):
        row = []
        for lang in langs:
            c = flagged[lang]
            if group is None:  # items with personal data on which anything was found
                hits = c["sensitive"] + c["split"]
                n = c["sensitive/n"] + c["split/n"]
                row.append(f"{hits / n:6.0%} ({hits}/{n})" if n else "     -")
            else:
                row.append(share(c, group))
        print(f"{label:22}" + "".join(f"{r:>16}" for r in row))
    total = Counter[str]()
    for k in kind_names:
        total["x"] += per_kind["all"][k]
        total["x/n"] += per_kind["all"][k + "/n"]
    print(f"{'recall, all kinds':22}{share(total, 'x'):>16}")


def prose(tokens: int, items: list[dict[str, object]], salt: int) -> str:
    benign = [
        str(m["content"])  # type: ignore[index]
        for i in items
        if i["group"] == "benign"
        for m in i["messages"]  # type: ignore[attr-defined]
    ]
    parts, i = [f"Request {salt}."], salt
    while estimate_text_tokens(" ".join(parts)) < tokens:
        parts.append(benign[i % len(benign)])
        i += 7
    return " ".join(parts)


def latency(scanner: PrivacyScanner, tokens: int, n: int, items: list[dict[str, object]]) -> str:
    texts = [[{"role": "user", "content": prose(tokens, items, s)}] for s in range(n + 5)]
    for t in texts[:5]:
        scanner.scan(t)
    ms = []
    for t in texts[5:]:
        t0 = time.perf_counter()
        scanner.scan(t)
        ms.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return f"p50 {q[49]:7.2f} ms  p99 {q[98]:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer latency samples (n=30)")
    ap.add_argument("--n", type=int, default=200, help="latency samples per figure")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    n = 30 if args.quick else args.n
    items = load()
    print(f"corpus: {len(items)} items, {dict(Counter(str(i['group']) for i in items))}")
    patterns = PrivacyScanner(ner="off")
    ner = PrivacyScanner(ner="on")
    both = PrivacyScanner(ner="on", detect=False)
    t0 = time.perf_counter()
    ner.warm()
    load_s = time.perf_counter() - t0
    both.warm()
    print(f"NER layer: {ner.status().describe()}")
    results = {
        "before: patterns only": evaluate(items, patterns),
        "after: patterns + NER (language detected)": evaluate(items, ner),
        "after: patterns + NER (both pipelines on every text)": evaluate(items, both),
    }
    for name, result in results.items():
        report(name, result)
    print("\nmissed with NER (language detected):")
    for line in results["after: patterns + NER (language detected)"]["missed"]:  # type: ignore[attr-defined]
        print("  ", line)
    print(f"\nlatency of one scan, n={n} (NER layer load, once per process: {load_s:.2f} s)")
    cost = {}
    for tokens in (50, 2000):
        for name, s in (("patterns", patterns), ("+NER", ner), ("+NER both", both)):
            cost[f"{tokens} tokens {name}"] = figure = latency(s, tokens, n, items)
            print(f"  ~{tokens:4} tokens  {name:10} {figure}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "latency": cost}, indent=1))


if __name__ == "__main__":
    main()
