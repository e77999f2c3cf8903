"""Privacy detector benchmark: scan() latency for a 2,000-token prompt.

    python benchmarks/bench_privacy.py [--n 1000] [--tokens 2000] [--json PATH]

The prompt is built from the benign test corpus (prose, code, numbers, dates, hashes), repeated
until the test model's tokenizer (SmolLM2, vocabulary only) counts `--tokens` tokens; a second
variant has a few secrets (email, card, key) spread through it; a third is 8,000 characters
(about 2,000 tokens of English prose at 4 characters a token; the corpus is number-heavy, and
the tokenizer splits numbers digit by digit). Baseline, in the same run: one
pass of a single compiled regex (`\\S+`) over the same text, the least any regex scanner pays.
Figures: p50 / p99 / max in milliseconds, and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import re  # noqa: E402

from hybridllm.engines.base import GenerationRequest  # noqa: E402
from hybridllm.engines.scripted import ScriptedEngine  # noqa: E402
from hybridllm.guard.guarded import GuardedEngine  # noqa: E402
from hybridllm.guard.privacy import scan  # noqa: E402
from tests.privacy_corpus import BENIGN  # noqa: E402


def token_counter() -> tuple[Callable[[str], int], str]:
    try:
        import llama_cpp

        from hybridllm.local.resolve import resolve_model

        path = resolve_model("smollm2-135m-instruct")
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        return (lambda s: len(llm.tokenize(s.encode(), add_bos=False))), "SmolLM2 tokenizer"
    except Exception:  # no model here: about 4 characters per token
        return (lambda s: len(s) // 4), "4 characters per token (no tokenizer available)"


def build_prompt(tokens: int, count: Callable[[str], int]) -> str:
    parts: list[str] = []
    i = 0
    while count("\n".join(parts)) < tokens:
        parts.append(BENIGN[i % len(BENIGN)])
        i += 1
    return "\n".join(parts)


def timings_ms(fn: Callable[[], object], n: int) -> tuple[list[float], list[float]]:
    """Wall-clock and thread CPU milliseconds per call (CPU time leaves out the time other
    processes on a busy machine took the core)."""
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c) * 1e3)
        wall.append((time.perf_counter() - t) * 1e3)
    return wall, cpu


def summary(runs: tuple[list[float], list[float]]) -> dict[str, float]:
    wall, cpu = runs
    q = statistics.quantiles(wall, n=100, method="inclusive")
    qc = statistics.quantiles(cpu, n=100, method="inclusive")
    return {"p50": q[49], "p99": q[98], "max": max(wall), "cpu_p50": qc[49], "cpu_p99": qc[98]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    count, how = token_counter()
    benign = build_prompt(args.tokens, count)
    third = len(benign) // 3
    secret = (
        benign[:third]
        + " mail maria.gonzalez84@gmail.com "
        + benign[third : 2 * third]
        + " card 4111 1111 1111 1111, key sk-proj-Xk29dLq8Zr7Wm3Np5Tv1Yb6Hc4Js0Fg "
        + benign[2 * third :]
    )
    assert scan(benign) == () and len(scan(secret)) == 3
    prose = benign
    while len(prose) < 8000:
        prose += "\n" + benign
    prose = prose[:8000]
    guard = GuardedEngine(ScriptedEngine("cloud"), privacy="off")
    request = GenerationRequest(messages=[{"role": "user", "content": benign}])
    word = re.compile(r"\S+")
    results = {
        "baseline one regex pass": summary(timings_ms(lambda: word.findall(benign), args.n)),
        "scan, benign prompt": summary(timings_ms(lambda: scan(benign), args.n)),
        "scan, prompt with 3 secrets": summary(timings_ms(lambda: scan(secret), args.n)),
        "scan, 8,000 characters": summary(timings_ms(lambda: scan(prose), args.n)),
        "GuardedEngine.findings(request)": summary(
            timings_ms(lambda: guard.findings(request), args.n)
        ),
    }
    base = results["baseline one regex pass"]
    print(f"prompt: {count(benign)} tokens ({how}), {len(benign)} characters; n={args.n}")
    print(
        f"{'':32} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'cpu p50':>8} {'cpu p99':>8}"
        f" {'p50 / baseline':>15}"
    )
    for name, r in results.items():
        ratio = r["p50"] / base["p50"]
        print(
            f"{name:32} {r['p50']:7.3f} {r['p99']:7.3f} {r['max']:7.3f} {r['cpu_p50']:8.3f}"
            f" {r['cpu_p99']:8.3f} {ratio:15.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"tokens": count(benign), "results": results}, indent=1))


if __name__ == "__main__":
    main()
