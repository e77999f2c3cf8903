"""The event loop's longest stall while a fresh prompt is admitted (issue 24, section 6).

A ticker task sleeps 1 ms at a time and records the longest gap between its wake-ups while
`client.stream()` admits a prompt the client has not seen (the privacy scan caches repeats)
and the first event arrives. Two clients in the same run, on scripted engines (admission only):
- "inline": every step of admission on the loop, as before issue 24 (`_costly` forced False);
- "off the loop": as shipped (a long prompt, or the NER layer, admitted on a worker thread).
Policies: `long-writing` with `[privacy] ner = true` (the NER layer, when `hybridllm[privacy]`
is installed) and the default patterns-only scan. Target: the off-the-loop stall <= 10 ms for a
fresh 2,000-token prompt.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_admission.py [--repeat 5] [--switch-ms 1]

What stalls the loop off the loop is the GIL: the worker thread runs Python (Presidio's regular
expressions, the router's features) and hands the GIL back every `sys.getswitchinterval()`
(5 ms by default); `--switch-ms 1` shows the figures an app gets with
`sys.setswitchinterval(0.001)` (a process-wide setting hybridllm leaves to the app).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

import hybridllm.client as client_mod
from hybridllm import HybridClient, Policy
from hybridllm.testing import ScriptedEngine

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray"
).split()
SIZES = (155, 2_015, 6_200, 12_400)  # characters, as measured in the issue


def prompt(chars: int, rng: random.Random) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS) + str(rng.randrange(1000)))
    return " ".join(out)[:chars]


@contextmanager
def inline_admission(on: bool) -> Iterator[None]:
    saved = client_mod._costly
    if on:
        client_mod._costly = lambda ticket: False  # type: ignore[assignment]
    try:
        yield
    finally:
        client_mod._costly = saved


async def stall_ms(client: HybridClient, text: str, policy: Policy) -> float:
    worst, last, done = 0.0, anyio.current_time(), anyio.Event()

    async def tick() -> None:
        nonlocal worst, last
        while not done.is_set():
            await anyio.sleep(0.001)
            now = anyio.current_time()
            worst, last = max(worst, now - last), now

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.sleep(0.01)
        last = anyio.current_time()
        s = client.stream(text, policy=policy)
        async with s:
            async for _ in s.events():
                break
        done.set()
    return worst * 1e3


async def measure(repeat: int) -> dict[str, dict[str, list[float]]]:
    rng = random.Random(7)
    ner = Policy.preset("long-writing").with_(name="lw-ner", privacy={"ner": True})
    plain = Policy.preset("long-writing")
    out: dict[str, dict[str, list[float]]] = {}
    for mode in ("inline", "off the loop"):
        local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
        async with HybridClient(local=local, cloud=cloud, policy=ner) as client:
            client.routing.privacy("warm-up: Jane Doe", deep=True)  # load the NER layer first
            with inline_admission(mode == "inline"):
                for pol in (ner, plain):
                    for chars in SIZES:
                        key = f"{pol.name} {chars} chars"
                        for _ in range(repeat):
                            ms = await stall_ms(client, prompt(chars, rng), pol)
                            out.setdefault(key, {}).setdefault(mode, []).append(ms)
    return out


def cpu() -> str:
    """The CPU, as /proc/cpuinfo names it (absolute figures move between machines)."""
    try:
        with open("/proc/cpuinfo") as fh:
            first = fh.read().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    info = {
        k.strip(): v.strip()
        for k, v in (ln.split(":", 1) for ln in first.splitlines() if ":" in ln)
    }
    return f"{info.get('model name')} (family {info.get('cpu family')} model {info.get('model')})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--switch-ms", type=float, help="sys.setswitchinterval, in ms (default 5)")
    args = ap.parse_args()
    if args.switch_ms:
        sys.setswitchinterval(args.switch_ms / 1000)
    res = anyio.run(measure, args.repeat)
    switch = sys.getswitchinterval() * 1e3
    print(f"CPU: {cpu()}; GIL switch interval {switch:g} ms; loop stall, median (max) ms")
    print(f"{'prompt':<28}{'inline':>18}{'off the loop':>18}")
    for key, modes in res.items():
        cells = [f"{statistics.median(v):7.1f} ({max(v):6.1f})" for v in modes.values()]
        print(f"{key:<28}{cells[0]:>18}{cells[1]:>18}")


if __name__ == "__main__":
    main()
