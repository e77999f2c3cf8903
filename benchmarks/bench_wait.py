"""How llama.cpp's OpenMP threads should wait: decode speed and CPU burnt while idle.

Each setting runs in a fresh process (OpenMP reads its environment once, when llama.cpp loads):
load the model, warm up, decode 64 tokens three times (best of three), then sit idle for 5 s
and measure the process's CPU time over that idle span. Every setting runs on quiet cores and
again with one other process spinning on one core.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_wait.py [--model NAME] [--threads N]

Settings: libgomp's default (no variable set: spin a while, then sleep), OMP_WAIT_POLICY passive
and active, and bounded spinning (GOMP_SPINCOUNT=N with no policy set). Compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

SETTINGS: dict[str, dict[str, str]] = {
    "libgomp default": {},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "active": {"OMP_WAIT_POLICY": "active"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "GOMP_SPINCOUNT=100000": {"GOMP_SPINCOUNT": "100000"},
}
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def child(model: str, threads: int, idle_s: float) -> None:
    import llama_cpp  # raw llama-cpp-python: this process measures the library, not hybridllm

    llm = llama_cpp.Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                          verbose=False)  # fmt: skip
    tokens = llm.tokenize(PROMPT.encode())
    best = 0.0
    for _ in range(4):  # the first round warms up
        llm.reset()
        llm.eval(tokens)
        t0, n = time.perf_counter(), 0
        for tok in llm.generate(tokens, temp=0.0, reset=False):
            n += 1
            if n >= 64 or tok == llm.token_eos():
                break
        best = max(best, n / (time.perf_counter() - t0))
    usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(idle_s)
    usage1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    print(json.dumps({"decode_tps": best, "idle_cpu_pct": 100.0 * cpu / wall}))


def measure(model: str, threads: int, env: dict[str, str], busy: bool) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    hog = None
    if busy:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", model, str(threads)],
            env={**clean, **env}, capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=0, help="0: every usable core")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), 5.0)
        return
    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import cpu_threads

    path = str(resolve_model(args.model, pull=True))
    threads = args.threads or cpu_threads()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = (line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
            cpu = next(names)
    except (OSError, StopIteration):
        pass
    print(f"{args.model}, {threads} threads, {cpu_threads()} usable cores, CPU: {cpu}")
    print(f"{'setting':<24} {'decode t/s quiet':>17} {'idle CPU % quiet':>17} "
          f"{'decode t/s, 1 core busy':>24}")  # fmt: skip
    for name, env in SETTINGS.items():
        quiet = measure(path, threads, env, busy=False)
        busy = measure(path, threads, env, busy=True)
        print(f"{name:<24} {quiet['decode_tps']:17.1f} {quiet['idle_cpu_pct']:17.1f} "
              f"{busy['decode_tps']:24.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
