"""The privacy judge's name test (`hybridllm.guard.privacy_known`) on one local model: its bar,
how many private names it would clear (wrongly), how many public figures it knows, and what
one name costs (issue 31).

    PYTHONPATH=. python benchmarks/bench_name_test.py [--model qwen2.5-coder-0.5b-instruct]
        [--threads 2]

Names:
- private: the `person` spans the NER layer finds in the private items (groups "sensitive" and
  "split") of `data/privacy/corpus.jsonl`, two words or more, none a German noun phrase the
  scan took for a name (spans that start with "Mein", "Tax", "Welch", "Remind", and the two
  street names "Fort Collins", "Harbour Close");
- public: `data/privacy/public_names_probe.txt`, 137 public figures written by hand before the
  shipped list was extended (most are on it now: the test is measured on them all, and on
  those the list does not hold apart).
Time per name: one `NameRecogniser.score` after the bar is measured (the list's prefix cached),
on a model nobody else uses; P50 / P99 over all names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from benchmarks._report import cpu_model  # noqa: E402

NOT_NAMES = ("Mein", "Tax", "Welch", "Remind", "Fort Collins", "Harbour Close")


def private_names() -> list[str]:
    from hybridllm.guard.privacy_ner import PrivacyScanner

    scanner = PrivacyScanner(ner="on")
    out: set[str] = set()
    for line in (HERE / "data" / "privacy" / "corpus.jsonl").read_text().splitlines():
        item = json.loads(line)
        if item["group"] not in ("sensitive", "split"):
            continue
        texts = {f"messages[{i}].content": m["content"] for i, m in enumerate(item["messages"])}
        for f in scanner.scan(item["messages"]):
            span = texts.get(f.location, "")[f.start : f.end].rstrip("'’s").rstrip("'’")
            if f.kind == "person" and len(span.split()) >= 2 and span[:1].isupper():
                out.add(span)
    return sorted(n for n in out if not n.startswith(NOT_NAMES))


def public_names() -> list[str]:
    text = (HERE / "data" / "privacy" / "public_names_probe.txt").read_text(encoding="utf-8")
    return [s for line in text.splitlines() if (s := line.strip()) and not s.startswith("#")]


async def measure(model: Path, threads: int) -> None:
    from hybridllm.engines.llamacpp import LlamaCppEngine
    from hybridllm.guard.privacy_known import NameRecogniser
    from hybridllm.guard.privacy_public import is_public_figure

    private, public = private_names(), public_names()
    engine = LlamaCppEngine(model, n_ctx=1024, n_threads=threads)
    await engine.start()
    names = NameRecogniser(engine)
    t0 = time.perf_counter()
    bar = await names.bar()
    bar_s = time.perf_counter() - t0
    ms: list[float] = []

    async def known(name: str) -> bool:
        t = time.perf_counter()
        score = await names.score(name)
        ms.append((time.perf_counter() - t) * 1e3)
        return score > bar

    cleared = [n for n in private if await known(n)]
    knew = [n for n in public if await known(n)]
    await engine.aclose()
    off = [n for n in public if not is_public_figure(n)]
    q = statistics.quantiles(ms, n=100, method="inclusive")
    print(f"model {model.name}; CPU {cpu_model()}; {threads} threads")
    print(f"bar {bar:.2f} (measured in {bar_s:.1f} s)")
    print(f"private names cleared: {len(cleared)} / {len(private)} {cleared}")
    print(f"public figures known: {len(knew)} / {len(public)} ({len(knew) / len(public):.0%})")
    print(f"  of those not on the shipped list: {len([n for n in off if n in knew])} / {len(off)}")
    print(f"time per name: P50 {q[49]:.0f} ms, P99 {q[98]:.0f} ms")


def main() -> None:
    from hybridllm.local.resolve import resolve_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = Path(args.model) if args.model.endswith(".gguf") else resolve_model(args.model)
    anyio.run(measure, model, args.threads)


if __name__ == "__main__":
    main()
