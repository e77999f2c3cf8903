"""Speed and quality of requantized variants (`name:quant`) against their base model.

    python benchmarks/bench_quant.py [--model NAME] [--quants q4_0,iq4_nl,q8_0] [--rounds N]
                                     [--text FILE ...]

Makes each variant (`hybridllm.local.variants.make`, timed), then, per round and model in turn (so
drift hits every arm alike): prefill of a 256-token prompt from an empty cache and 32 one-token
decode steps (the measurements `hybridllm tune` uses), with the engine's default settings and
`--ubatch`.
Quality: perplexity on the given texts (default: this repository's README and the race plan
source), in 512-token windows that score their second half. `--tasks N`: also accuracy on N
router-labelled prompts of each kind (short answer, yes/no, number, multiple choice by the most
likely option letter), greedy, scored as `scripts/label_router_data.py` scores them, and how
often the variant's answer equals the base's. The table reports medians over rounds and ratios
against the base measured in the same run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))  # the labeller's scoring and letter grammar
WINDOW = 512
MAX_TOKENS = {"short": 24, "yesno": 4, "number": 12, "mc": 1}


def perplexity(llm: Any, text: str, max_tokens: int = 4096) -> tuple[float, int]:
    tokens = llm.tokenize(text.encode(), add_bos=False, special=False)[:max_tokens]
    nll, n = 0.0, 0
    for start in range(0, len(tokens) - WINDOW + 1, WINDOW):
        chunk = tokens[start : start + WINDOW]
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[: len(chunk)], dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        for i in range(WINDOW // 2, len(chunk) - 1):
            nll -= logp[i, chunk[i + 1]]
            n += 1
    return math.exp(nll / max(n, 1)), n


def task_rows(labels: Path, per_kind: int) -> list[dict[str, Any]]:
    import json
    import random

    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    random.Random(0).shuffle(rows)
    out: list[dict[str, Any]] = []
    for kind in MAX_TOKENS:
        out += [r for r in rows if r["kind"] == kind][:per_kind]
    return out


def answers(llm: Any, rows: list[dict[str, Any]]) -> list[str]:
    from label_router_data import letter_grammar

    out = []
    for row in rows:
        grammar = letter_grammar(row["prompt"]) if row["kind"] == "mc" else None
        res = llm.create_chat_completion(
            [{"role": "user", "content": row["prompt"]}],
            max_tokens=MAX_TOKENS[row["kind"]],
            temperature=0.0,
            grammar=grammar,
        )
        out.append(res["choices"][0]["message"]["content"] or "")
    return out


def main() -> None:
    import llama_cpp

    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import DEFAULT_SETTINGS
    from hybridllm.local.tune import bench_tokens, measure_decode, measure_prefill
    from hybridllm.local.variants import make

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--quants", default="q4_0,iq4_nl,q8_0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=0, help="labelled prompts per kind (0: none)")
    ap.add_argument("--labels", type=Path, default=ROOT / "data/router/labels.jsonl")
    ap.add_argument("--ubatch", type=int, default=512, help="n_ubatch (tune picks 512 here)")
    ap.add_argument(
        "--text",
        type=Path,
        nargs="*",
        default=[ROOT / "README.md", ROOT / "hybridllm/runtime/plans/race.py"],
    )
    args = ap.parse_args()
    names = [args.model] + [f"{args.model}:{q}" for q in args.quants.split(",") if q]
    made: dict[str, float] = {}
    for name in names[1:]:
        t0 = time.perf_counter()
        make(name)
        made[name] = time.perf_counter() - t0
    settings = DEFAULT_SETTINGS.replace(n_ubatch=args.ubatch).resolved()

    def load(name: str, **kw: Any) -> Any:
        path = str(resolve_model(name))
        return llama_cpp.Llama(path, n_ctx=2048, verbose=False, **settings.llama_kwargs(), **kw)

    llms = {name: load(name) for name in names}
    pre: dict[str, list[float]] = {n: [] for n in names}
    dec: dict[str, list[float]] = {n: [] for n in names}
    for llm in llms.values():
        measure_prefill(llm, bench_tokens(llm, 64))  # warm-up: page the weights in
    for _ in range(args.rounds):
        for name, llm in llms.items():
            prompt = bench_tokens(llm, 256)
            pre[name].append(measure_prefill(llm, prompt))
            dec[name].append(measure_decode(llm, prompt[:32], 32))
    for llm in llms.values():
        llm.close()
    text = "\n".join(p.read_text(encoding="utf-8") for p in args.text)
    ppl = {}
    for name in names:  # logits for every position: a separate, slower context
        llm = load(name, logits_all=True)
        ppl[name] = perplexity(llm, text)
        llm.close()
    said: dict[str, list[str]] = {}
    rows = task_rows(args.labels, args.tasks) if args.tasks else []
    for name in names if rows else []:
        llm = load(name)
        said[name] = answers(llm, rows)
        llm.close()
    base = names[0]
    p0, d0, q0 = statistics.median(pre[base]), statistics.median(dec[base]), ppl[base][0]
    print(f"settings: {settings}; perplexity over {ppl[base][1]} tokens of {len(args.text)} files")
    if rows:
        from label_router_data import Item, score

        items = [Item(r["source"], r["id"], r["prompt"], r["kind"], r["answer"], 0) for r in rows]
        print(f"tasks: {len(rows)} labelled prompts, {args.tasks} of each kind {list(MAX_TOKENS)}")
    print(
        "| model | file MB | prefill t/s | decode t/s | perplexity | tasks right | same as base "
        "| made in |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        p, d, q = statistics.median(pre[name]), statistics.median(dec[name]), ppl[name][0]
        size = Path(resolve_model(name)).stat().st_size / 1e6
        when = f"{made[name]:.0f} s" if name in made else "base"
        right = same = "-"
        if rows:
            right = (
                f"{sum(score(i, a) for i, a in zip(items, said[name], strict=True))}/{len(rows)}"
            )
            agree = sum(a.strip() == b.strip() for a, b in zip(said[name], said[base], strict=True))
            same = f"{agree}/{len(rows)}"
        print(
            f"| {name} | {size:.0f} | {p:.0f} ({p / p0:.2f}x) | {d:.1f} ({d / d0:.2f}x) "
            f"| {q:.2f} ({(q / q0 - 1) * 100:+.1f}%) | {right} | {same} | {when} |"
        )


if __name__ == "__main__":
    main()
