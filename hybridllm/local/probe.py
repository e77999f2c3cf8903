"""Subprocess entry of `waitpolicy.measure`: `python -m hybridllm.local.probe MODEL SETTINGS`.

A process cannot switch its OpenMP wait policy once llama.cpp has loaded, so each policy is
measured in a fresh process started with `OMP_WAIT_POLICY` set; this module is that process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hybridllm.local.settings import LlamaSettings
from hybridllm.local.tune import _Search


def main(argv: list[str]) -> None:
    """Subprocess entry: measure one model with the given settings under this process's
    policy and print {"prefill_tps", "decode_tps"} as JSON."""
    path, settings = Path(argv[0]), LlamaSettings(**json.loads(argv[1]))
    quick = "--quick" in argv[2:]
    search = _Search(path, n_ctx=2048, prompt_tokens=128 if quick else 256,
                     decode_tokens=12 if quick else 24, reps=1 if quick else 2,
                     progress=None, steps=2)  # fmt: skip
    llm = search.load(settings)
    try:
        search.rates(llm, "warm-up", decode=False)
        r = search.rates(llm, "measure")
    finally:
        llm.close()
    print(json.dumps({"prefill_tps": r.prefill_tps, "decode_tps": r.decode_tps}))


if __name__ == "__main__":
    main(sys.argv[1:])
