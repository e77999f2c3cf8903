"""Subprocess entry of `waitpolicy.measure`: `python -m hybridllm.local.probe MODEL SETTINGS`.

A process cannot switch its OpenMP wait policy once llama.cpp has loaded, so each policy is
measured in a fresh process started with `OMP_WAIT_POLICY` set; this module is that process.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from hybridllm.local.settings import LlamaSettings
from hybridllm.local.tune import SettingsSearch

IDLE_S = 2.0


def main(argv: list[str]) -> None:
    """Subprocess entry: measure one model with the given settings under this process's wait
    setting and print {"prefill_tps", "decode_tps", "idle_cpu_pct"} as JSON: the last is the
    share of a core the process burns while the model sits loaded and idle (`IDLE_S`)."""
    path, settings = Path(argv[0]), LlamaSettings(**json.loads(argv[1]))
    quick = "--quick" in argv[2:]
    search = SettingsSearch(path, n_ctx=2048, prompt_tokens=128 if quick else 256,
                     decode_tokens=12 if quick else 24, reps=1 if quick else 2,
                     progress=None, steps=2)  # fmt: skip
    llm = search.load(settings)
    try:
        search.rates(llm, "warm-up", decode=False)
        r = search.rates(llm, "measure")
        idle = _idle_cpu_pct(IDLE_S if not quick else IDLE_S / 2)
    finally:
        llm.close()
    print(json.dumps({"prefill_tps": r.prefill_tps, "decode_tps": r.decode_tps,
                      "idle_cpu_pct": idle}))  # fmt: skip


def _idle_cpu_pct(seconds: float) -> float:
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(seconds)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return 100.0 * cpu / wall


if __name__ == "__main__":
    main(sys.argv[1:])
