"""What "keep-local" with names costs (issue 42, item 7): the NER layer on by default.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_keep_local.py [--n 60] [--voice 20] [--json F]

Four parts, each with `[privacy] ner = false` (the patterns alone: the old default) beside the
new default (`ner` unset: the NER layer, with `hybridllm[privacy]` installed), in one run:

1. Admission per preset: P50/P99 ms of `client.decide()` (the privacy scan, the router's
   features where the preset uses it, the decision) on a prompt of the preset's typical size,
   a new benign text each call (no cache answers), scripted engines (admission only).
2. The NER layer's load: seconds to load the spaCy pipelines (a fresh process) and the
   resident memory it adds (VmRSS before and after).
3. Where answers go: on the labelled privacy sets (data/privacy, held-out sets only), the share
   of private prompts `decide()` keeps on the device and of benign prompts it still sends to
   the cloud, under a cloud-first policy (the grading is the set's labels).
4. The voice preset's TTFT on the real local engine (Qwen2.5-Coder 0.5B, the demo's model) with
   a cloud configured (a scripted cloud whose first token comes after 5 s, so the device
   answers): P50/P99 ms against the preset's 400 ms deadline, short spoken turns, alternating
   the two settings request by request.

Run it on quiet cores: the NER layer and llama.cpp share the two.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from benchmarks._report import cpu_model, report
from hybridllm import HybridClient, Policy
from hybridllm.guard.prices import ModelPrice, Prices
from hybridllm.testing import ScriptedEngine

HERE = Path(__file__).resolve().parent.parent
SETS = sorted((HERE / "data" / "privacy").glob("heldout*.jsonl"))
# typical prompt sizes per preset, in characters (about 4 a token)
SIZES = {
    "voice-assistant": 160,  # one spoken turn and a short system line
    "code-completion": 2400,  # the code around the cursor
    "chat": 1200,  # a few turns
    "npc-dialogue": 1600,  # a persona and recent lines
    "translation": 600,
    "long-writing": 800,
    "batch": 4000,
}
VOICE = [
    "What's the weather like tomorrow morning?",
    "Set a reminder to water the plants at six.",
    "How long should I boil an egg for a soft yolk?",
    "Tell me a quick fact about octopuses.",
    "What's a good name for a grey cat?",
    "How many minutes are in three and a half hours?",
    "Give me a word that rhymes with orange.",
    "What should I cook with rice and spinach?",
]


def benign_texts() -> list[str]:
    out: list[str] = []
    for path in SETS:
        for line in path.read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            if item["group"] == "benign":
                out += [str(m["content"]) for m in item["messages"] if m.get("content")]
    return out


def prose(chars: int, benign: list[str], rng: random.Random) -> str:
    parts = [f"Request {rng.randrange(10**9)}."]
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(rng.choice(benign))
    return " ".join(parts)[:chars]


def quantiles(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50": round(q[49], 2), "p99": round(q[98], 2)}


def settings(policy: Policy) -> dict[str, Policy]:
    return {"ner=false": policy.with_(privacy={"ner": False}), "default": policy}


async def admission(n: int) -> dict[str, Any]:
    benign, rng = benign_texts(), random.Random(7)
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    out: dict[str, Any] = {}
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    async with HybridClient(local=local, cloud=cloud, prices=prices) as client:
        for preset, chars in SIZES.items():
            for name, pol in settings(Policy.preset(preset)).items():
                ms = []
                for i in range(n + 3):
                    text = prose(chars, benign, rng)
                    t0 = time.perf_counter()
                    client.decide(text, policy=pol)
                    if i >= 3:
                        ms.append((time.perf_counter() - t0) * 1e3)
                out[f"{preset} {name}"] = quantiles(ms)
    return out


def load_cost() -> dict[str, float]:
    code = (
        "import time, json\n"
        "def rss():\n"
        "    for l in open('/proc/self/status'):\n"
        "        if l.startswith('VmRSS'): return int(l.split()[1]) / 1024\n"
        "from hybridllm.guard.privacy_ner import default_scanner\n"
        "s = default_scanner(); before = rss(); t0 = time.perf_counter(); s.warm()\n"
        "print(json.dumps({'load_s': time.perf_counter() - t0, 'rss_mib': rss() - before}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: round(v, 2) for k, v in figures.items()}


async def where_answers_go() -> dict[str, Any]:
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    cloud_first = Policy(name="cloud-first", routing={"prefer": "cloud"})
    counts: dict[str, list[int]] = {}
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        for path in SETS:
            for line in path.read_text(encoding="utf-8").splitlines():
                item = json.loads(line)
                if item["group"] not in ("sensitive", "split", "benign"):
                    continue
                for name, pol in settings(cloud_first).items():
                    key = f"{item['group']} {name}"
                    hit = client.decide(item["messages"], policy=pol).decision.primary
                    tally = counts.setdefault(key, [0, 0])
                    tally[0] += hit == ("cloud" if item["group"] == "benign" else "local")
                    tally[1] += 1
    return {k: f"{a}/{b}" for k, (a, b) in counts.items()}


async def voice_ttft(n: int) -> dict[str, Any]:
    from hybridllm import LlamaCppEngine

    local = LlamaCppEngine("qwen2.5-coder-0.5b-instruct")
    cloud = ScriptedEngine("cloud", tokens=["c"], ttft_s=5.0)
    voice = Policy.preset("voice-assistant")
    ms: dict[str, list[float]] = {name: [] for name in [*settings(voice), "no cloud"]}
    rng = random.Random(3)
    async with (
        HybridClient(local=local, cloud=cloud, router=None) as client,
        HybridClient(local=local, router=None) as alone,  # the engine's own TTFT: no scan at all
    ):
        await client.complete("Hello.", max_tokens=2)  # load and warm
        for i in range(n + 2):
            runs = [*((name, client, pol) for name, pol in settings(voice).items())]
            for name, c, pol in [*runs, ("no cloud", alone, voice)]:
                text = f"{rng.choice(VOICE)} ({rng.randrange(10**6)})"
                done = await c.complete(text, policy=pol, max_tokens=4)
                if i >= 2 and done.trace.ttft_ms is not None:
                    ms[name].append(done.trace.ttft_ms)
    return {name: quantiles(v) for name, v in ms.items()}


def render(res: dict[str, Any]) -> str:
    head = "admission (decide) ms    ner=false P50/P99   default P50/P99"
    lines = [f"CPU: {res['cpu']}", "", head]
    for preset in SIZES:
        a, b = res["admission"][f"{preset} ner=false"], res["admission"][f"{preset} default"]
        lines.append(
            f"  {preset:<16} {SIZES[preset]:>5} ch  {a['p50']:>7.2f} / {a['p99']:<7.2f}"
            f"  {b['p50']:>7.2f} / {b['p99']:<7.2f}"
        )
    lo = res["load"]
    lines += ["", f"NER load: {lo['load_s']:.2f} s, +{lo['rss_mib']:.0f} MiB resident", ""]
    lines.append("held-out sets, decide() under a cloud-first policy:")
    for key, value in res["routing"].items():
        what = "sent to the cloud" if key.startswith("benign") else "kept local"
        lines.append(f"  {key:<22} {what}: {value}")
    if "voice" in res:
        lines += ["", "voice-assistant TTFT (real local engine), deadline 400 ms:"]
        for name, q in res["voice"].items():
            lines.append(f"  {name:<10} P50 {q['p50']:.0f} ms, P99 {q['p99']:.0f} ms")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"cpu": cpu_model(), "admission": await admission(args.n)}
    res["load"] = load_cost()
    res["routing"] = await where_answers_go()
    if args.voice:
        res["voice"] = await voice_ttft(args.voice)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60, help="admission samples per preset and setting")
    ap.add_argument("--voice", type=int, default=20, help="voice turns per setting (0: skip)")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("HYBRIDLLM_LOG_LEVEL", "ERROR")
    report(anyio.run(run, args), render, args.json)


if __name__ == "__main__":
    main()
