"""Prefill and decode speed of llama.cpp builds and engine settings on the same prompts.

    python benchmarks/bench_builds.py NAME=BUILD [NAME=BUILD ...] [--setting NAME=JSON ...]
                                      [--models a,b] [--rounds N]

BUILD is `default` (this interpreter's own build), a directory holding a `libllama.so` built
from llama-cpp-python's vendored llama.cpp (run with `LLAMA_CPP_LIB_PATH`, this interpreter), or
a Python interpreter of a venv with its own llama-cpp-python (`/tmp/v-x/bin/python`); optionally
followed by `+VAR=VALUE,...` for extra environment (e.g. `default+OMP_WAIT_POLICY=passive`).
The first build is the baseline. Each measurement is a fresh subprocess (a build that dies with
"Illegal instruction" shows as such, not as a crash of the benchmark); rounds interleave the
arms, and the table reports medians over rounds and ratios against the baseline measured in the
same run.
`--setting NAME=JSON` adds an arm on the first build with `LlamaSettings` fields changed (e.g.
`--setting t1='{"n_threads": 1}'`), compared against the first build's default settings.

`--base JSON` sets the settings of every arm (e.g. one thread). Contended cores (other
processes) slow OpenMP's multi-thread barriers many times over; the `*_cpu` columns (tokens per
CPU second of the process) compare kernels fairly for one-thread arms even then.

Per process: load the model, a warm-up prefill, then 3 x (prefill of a 256-token prompt and of
a 50-token prompt from an empty cache, 32 one-token decode steps after a 32-token context);
medians. Models: manifest names or GGUF paths (default: SmolLM2-135M and Qwen2.5-Coder-0.5B).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_MODELS = "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct"
REPS = int(os.environ.get("BENCH_REPS", "3"))
DECODE_STEPS = 32
KEYS = ("prefill", "prefill50", "decode", "prefill_cpu", "decode_cpu")


def worker(model: str, settings_json: str) -> None:
    import llama_cpp

    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import LlamaSettings
    from hybridllm.local.tune import bench_tokens, measure_decode, measure_prefill

    settings = LlamaSettings.from_dict(json.loads(settings_json))
    llm = llama_cpp.Llama(
        model_path=str(resolve_model(model)), n_ctx=2048, verbose=False, **settings.llama_kwargs()
    )
    prompt = bench_tokens(llm, 256)
    measure_prefill(llm, prompt[:64])  # warm-up
    pre, short, dec, cpu_pre, cpu_dec = [], [], [], [], []
    for _ in range(REPS):
        c0 = time.process_time()
        pre.append(measure_prefill(llm, prompt))
        c1 = time.process_time()
        short.append(measure_prefill(llm, prompt[:50]))
        c2 = time.process_time()
        dec.append(measure_decode(llm, prompt[:32], DECODE_STEPS))
        c3 = time.process_time()
        cpu_pre.append(len(prompt) / (c1 - c0))
        cpu_dec.append(DECODE_STEPS / (c3 - c2))  # includes the 32-token context: a lower bound
    info = llama_cpp.llama_print_system_info().decode()
    print(json.dumps({"prefill": statistics.median(pre), "prefill50": statistics.median(short),
                      "decode": statistics.median(dec), "prefill_cpu": statistics.median(cpu_pre),
                      "decode_cpu": statistics.median(cpu_dec), "system_info": info}))  # fmt: skip


def run_one(build: str, model: str, settings_json: str) -> dict[str, Any]:
    env = dict(os.environ)
    build, _, assigns = build.partition("+")  # BUILD+VAR=VALUE,VAR=VALUE: extra environment
    env.update(a.split("=", 1) for a in assigns.split(",") if a)
    python = sys.executable
    if build != "default":
        if Path(build).is_dir():
            env["LLAMA_CPP_LIB_PATH"] = build
        else:
            python = build
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    cmd = [python, __file__, "--worker", model, "--settings", settings_json]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        why = (
            f"killed by {signal.Signals(-proc.returncode).name}"
            if proc.returncode < 0
            else proc.stderr.strip().splitlines()[-1:]
        )
        return {"error": str(why)}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builds", nargs="*", metavar="NAME=BUILD")
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=JSON")
    ap.add_argument("--base", default="{}", metavar="JSON", help="settings of every arm")
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--worker", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.settings)
        return
    builds = [tuple(b.split("=", 1)) for b in args.builds] or [("default", "default")]
    base_settings = json.loads(args.base)
    arms = [(name, build, args.base) for name, build in builds]
    for name, js in (a.split("=", 1) for a in args.setting):
        arms.append((name, builds[0][1], json.dumps({**base_settings, **json.loads(js)})))
    models = args.models.split(",")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for model in models:
            order = arms if r % 2 == 0 else arms[::-1]  # alternate the order every round
            for name, build, settings in order:
                res = run_one(build, model, settings)
                results.setdefault((name, model), []).append(res)
                figures = " ".join(f"{k} {res[k]:.1f}" for k in KEYS if k in res)
                print(f"round {r + 1} {model} {name}: {res.get('error') or figures}",
                      file=sys.stderr, flush=True)  # fmt: skip
    keys = KEYS
    print("\n(t/s: tokens per wall second; *_cpu: tokens per CPU second of the whole process)")
    print(f"{'model':<28} {'arm':<10}" + "".join(f" {k:>11} {'x':>5}" for k in keys))
    for model in models:
        base: dict[str, float] = {}
        for name, _, _ in arms:
            runs = results[(name, model)]
            ok = [x for x in runs if "error" not in x]
            if not ok:
                print(f"{model:<28} {name:<10} {runs[0]['error']}")
                continue
            row = f"{model:<28} {name:<10}"
            for k in keys:
                v = statistics.median(float(x[k]) for x in ok)
                base.setdefault(k, v)
                row += f" {v:11.1f} {v / base[k]:5.2f}"
            print(row + ("" if len(ok) == len(runs) else f"  ({len(runs) - len(ok)} failed)"))


if __name__ == "__main__":
    main()
