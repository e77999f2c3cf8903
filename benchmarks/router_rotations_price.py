"""What prefill speed the router score's option rotations need to fit `[cascade] rotations_ms`
(issue 45 item 1): the rotations' tokens counted as the engine prices them, no decode.

    PYTHONPATH=. .venv/bin/python benchmarks/router_rotations_price.py [-n 230]
        [--bound-ms 300] [--speeds 120,240,360,480,720]

The prompts are bench_router_score's (`-n` held-out prompts of the labels' test split, in the
same order, one pass). For each multiple-choice prompt, its cycle of rotations is rendered and
counted against what the KV cache holds after the prompt before it (what bench_router_score's
engine holds then), exactly as `signals.rotation_cycle` counts them before the first rotation: the
tokens they prefill (`fresh`) and the part a local answer does not reuse (`fresh - shared`).
The engine reads a cycle where that part, at its measured prefill pace, is priced within the
bound and the whole cycle ends within half the cascade's hold (`rotations_within`); else the
prompt is scored by the plain stage-2 model. This prints the token counts, this machine's
prefill pace on rotation-sized batches (measured here), and for each prefill speed the share of
cycles that would be read and the P99 of the work they add. Where every cycle is read, the
bounded score is the unbounded one (bench_router_score's "always" row: its APGR); where none
is, the plain model's. A projection from token counts, not a timing of other machines.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

from benchmarks._report import cpu_model
from benchmarks.bench_router_score import held_out, pct
from hybridllm import Policy
from hybridllm.engines.llama.session import LlamaSession
from hybridllm.engines.llama.signals import ROTATIONS, option_letters, rotation_cycle
from hybridllm.local.resolve import resolve_model
from hybridllm.local.settings import DEFAULT_SETTINGS
from hybridllm.runtime.plans.cascade import rotations_within


def counts(session: LlamaSession, examples: list[Any]) -> list[tuple[int, int]]:
    """(fresh, fresh - shared) of each multiple-choice prompt's cycle, in order."""
    out = []
    held: list[int] = []
    for e in examples:
        msgs = [{"role": "user", "content": e.prompt}]
        asked = session.tokenize(session.render(msgs))
        letters = option_letters(e.prompt)
        if letters:
            session.llm.input_ids[: len(held)] = held  # what the KV cache holds now
            session.llm.n_tokens = len(held)
            cycle = rotation_cycle(session, msgs, asked, letters, ROTATIONS)
            out.append((cycle.fresh, cycle.fresh - cycle.shared))
        held = asked
    session.llm.n_tokens = 0
    return out


def pace_tps(session: LlamaSession, n: int, rounds: int = 5) -> float:
    """Prompt tokens a second on a batch of `n` after a cached 20-token start (a rotation's
    shape), median of `rounds`."""
    tokens = session.tokenize("The quick brown fox jumps over the lazy dog. " * 40)[: 20 + n]
    speeds = []
    for _ in range(rounds):
        session.llm.reset()
        session.llm.eval(tokens[:20])
        t0 = time.perf_counter()
        session.llm.eval(tokens[20:])
        speeds.append(n / (time.perf_counter() - t0))
    session.llm.reset()
    return statistics.median(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=230)
    parser.add_argument("--bound-ms", type=float, default=300.0)
    parser.add_argument("--speeds", default="120,240,360,480,720")
    args = parser.parse_args()
    session = LlamaSession(
        resolve_model("qwen2.5-coder-0.5b-instruct"),
        n_ctx=2048,
        settings=DEFAULT_SETTINGS.resolved(),
        extra={},
    )
    rows = counts(session, held_out(args.n))
    fresh = [f for f, _ in rows]
    unreused = [u for _, u in rows]
    within_s = rotations_within(Policy(name="b").cascade.hold_ms / 1000.0) or math.inf
    print(f"CPU {cpu_model()}; {args.n} held-out prompts, {len(rows)} multiple choice")
    for name, xs in (
        ("tokens prefilled (fresh)", fresh),
        ("not reused (fresh - shared)", unreused),
    ):
        print(f"  {name:<28} p50 {statistics.median(xs):.0f}  p90 {pct(xs, 0.9):.0f}  "
              f"p99 {pct(xs, 0.99):.0f}  max {max(xs)}")  # fmt: skip
    print(f"  this machine's prefill: {pace_tps(session, 40):.0f} tokens/s on 40-token batches")
    print(f"bound {args.bound_ms:.0f} ms, the whole cycle within {within_s * 1e3:.0f} ms:")
    for tps in (float(s) for s in args.speeds.split(",")):
        read = [u / tps for f, u in rows if u / tps <= args.bound_ms / 1e3 and f / tps <= within_s]
        added = read + [0.0] * (len(rows) - len(read))  # a prompt whose cycle is not read adds 0
        most = 1e3 * max(read or [0.0])
        print(f"  {tps:5.0f} tokens/s: cycles read {len(read)}/{len(rows)}, work they add p99 "
              f"{1e3 * pct(added, 0.99):.0f} ms (the most one adds: {most:.0f} ms)")  # fmt: skip
    need = max(max(u / (args.bound_ms / 1e3), f / within_s) for f, u in rows)
    print(f"every cycle read from {need:.0f} tokens/s")
    session.unload()


if __name__ == "__main__":
    main()
