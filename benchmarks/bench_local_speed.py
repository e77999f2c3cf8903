"""Local engine speed through `LlamaCppEngine`: TTFT of a short chat prompt, and prompt-lookup
drafting against plain greedy decoding.

    python benchmarks/bench_local_speed.py [--model NAME] [--section ttft|draft|all] [--reps N]

TTFT: a ~50-token chat prompt, measured from the `stream()` call to the first text delta, on the
first request after `start()` (cold) and on later requests with other prompts (warm), for an
engine started with and without its warm-up. Drafting: code-edit prompts (the answer copies most
of the prompt) and one free-writing prompt, each decoded greedily with and without
`draft="prompt-lookup"`, interleaved; decode rate = (completion tokens - 1) / (last delta - first
delta). The outputs must be identical (checked, printed). Medians; no timed assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import anyio

from hybridllm.engines import GenerationRequest, LlamaCppEngine, LlamaOptions
from hybridllm.events import Delta, Finish

CHAT = [
    "What is the difference between a list and a tuple in Python? Answer in two sentences.",
    "Give me three tips for writing clear commit messages, one line each please.",
    "Explain what a race condition is to a junior developer, briefly and simply.",
    "Suggest a short, friendly name for a command line tool that renames photos.",
]

FUNC = '''def total_price(items, tax_rate, discount=None):
    """Price of all items with tax, minus an optional discount."""
    x = 0
    for item in items:
        if item.quantity <= 0:
            continue
        x += item.price * item.quantity
    if discount is not None:
        x -= discount.amount_for(x)
    x = x * (1 + tax_rate)
    return round(x, 2)
'''
CLASS = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
"""
EDITS = [
    (
        "rename",
        f"Rename the variable x to subtotal in this function. Reply with the code only.\n\n"
        f"```python\n{FUNC}```",
    ),  # fmt: skip
    (
        "type-hints",
        "Add type hints to every method of this class. Reply with the code only.\n\n"
        f"```python\n{CLASS}```",
    ),  # fmt: skip
    (
        "docstring",
        "Fix the typo 'Invetory' if any and add a one-line docstring to each method. "
        f"Reply with the code only.\n\n```python\n{CLASS}```",
    ),  # fmt: skip
]
THREADS: list[int | None] = [None]
FREE = ("free-writing", "Write a short story about a lighthouse keeper who finds a message.")


async def one(
    engine: LlamaCppEngine, prompt: str, max_tokens: int, *options: LlamaOptions
) -> dict[str, float | str]:
    req = GenerationRequest([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                            temperature=0.0, options=options)  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    n = 0
    async for chunk in engine.stream(req):
        if isinstance(chunk, Delta):
            first = first or chunk.t
            last = chunk.t
            parts.append(chunk.text)
        elif isinstance(chunk, Finish):
            n = chunk.completion_tokens
    assert first is not None and last is not None
    rate = (n - 1) / (last - first) if n > 1 and last > first else float("nan")
    return {"ttft": first - t0, "rate": rate, "tokens": n, "text": "".join(parts)}


async def ttft(model: str, reps: int) -> None:
    print(f"\nTTFT, ~50-token chat prompt ({model})")
    print(f"{'engine':<16} {'start s':>8} {'cold ms':>8} {'warm ms (median)':>17}")
    for warm_up in (True, False):
        for _ in range(reps):
            engine = LlamaCppEngine(model, n_ctx=2048, warm_up=warm_up, n_threads=THREADS[0])
            t0 = time.perf_counter()
            await engine.start()
            start_s = time.perf_counter() - t0
            cold = await one(engine, CHAT[0], 1)
            warm = [await one(engine, p, 1) for p in CHAT[1:]]
            tokens = len(engine._session.prepare(  # type: ignore[union-attr]
                GenerationRequest([{"role": "user", "content": CHAT[0]}])).tokens)  # fmt: skip
            await engine.aclose()
            med = statistics.median(float(w["ttft"]) for w in warm) * 1000
            label = "warm-up " + ("on" if warm_up else "off")
            cold_ms = float(cold["ttft"]) * 1000
            print(f"{label:<16} {start_s:8.2f} {cold_ms:8.0f} {med:17.0f}   ({tokens} tokens)")


async def draft(model: str, reps: int, max_tokens: int) -> None:
    print(f"\nprompt-lookup drafting vs plain greedy decode ({model}, {max_tokens} tokens max)")
    engine = LlamaCppEngine(model, n_ctx=4096, n_threads=THREADS[0])
    await engine.start()
    rows = []
    try:
        for name, prompt in [*EDITS, FREE]:
            plain: list[float] = []
            drafted: list[float] = []
            same = True
            stats = engine.draft_stats
            assert stats is not None
            b0, d0, a0 = stats.batches, stats.drafted, stats.accepted
            for _ in range(reps):
                p = await one(engine, prompt, max_tokens)
                d = await one(engine, prompt, max_tokens, LlamaOptions(draft="prompt-lookup"))
                plain.append(float(p["rate"]))
                drafted.append(float(d["rate"]))
                same = same and p["text"] == d["text"]
            acc = (stats.accepted - a0) / max(1, stats.drafted - d0)
            per_batch = (stats.accepted - a0) / max(1, stats.batches - b0) + 1
            rows.append((name, int(p["tokens"]), statistics.median(plain),
                         statistics.median(drafted), acc, per_batch, same))  # fmt: skip
    finally:
        await engine.aclose()
    print(f"{'prompt':<14} {'tokens':>6} {'plain t/s':>10} {'drafted t/s':>12} {'x':>5} "
          f"{'accepted':>9} {'tok/batch':>9} identical")  # fmt: skip
    for name, n, p, d, acc, per, same in rows:
        print(f"{name:<14} {n:6d} {p:10.1f} {d:12.1f} {d / p:5.2f} {acc:9.0%} {per:9.2f} {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--section", choices=["ttft", "draft", "all"], default="all")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, help="n_threads (default: the engine's)")
    args = ap.parse_args()
    THREADS[0] = args.threads

    async def run() -> None:
        if args.section in ("ttft", "all"):
            await ttft(args.model, args.reps)
        if args.section in ("draft", "all"):
            await draft(args.model, args.reps, args.max_tokens)

    anyio.run(run)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
