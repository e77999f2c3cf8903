"""The OpenMP wait policy of llama.cpp's threads: passive unless this device was tuned otherwise.

llama.cpp (this build) runs its threads with OpenMP, which reads `OMP_WAIT_POLICY` once, when
the library loads: it is a per-process choice that must be made before `llama_cpp` is imported
(`loader.llama_cpp()` calls `apply()` just before it). Spinning waits ("active") decode faster
on quiet cores (measured here on 2 cores: Qwen2.5-Coder-0.5B 27.6 against 17.9 tokens/s,
SmolLM2-135M 103 against 31), but when anything else runs on the same cores a spinning 2-thread
decode collapses about 10x, where passive waiting loses little. So:

1. an `OMP_WAIT_POLICY` already in the environment wins;
2. else the device's stored choice (`device.json` in the model cache, written by
   `hybridllm tune --dedicated`, ignored on another CPU);
3. else passive.

`hybridllm tune` measures both policies on the model (`measure()`: one subprocess per policy,
since a process cannot switch) and prints them; it stores "active" only with `--dedicated` (the
user says nothing else heavy runs on these cores) and only where active measured faster (see
`pick`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

Policy = Literal["active", "passive"]
ENV = "OMP_WAIT_POLICY"
FILE = "device.json"
PROBE_TIMEOUT_S = 300.0


def device_file() -> Path:
    from hybridllm.local.models import cache_dir

    return cache_dir() / FILE


def stored() -> dict[str, Any] | None:
    """The device's stored choice, when there is one for this CPU (else None)."""
    path = device_file()
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        policy = data["omp_wait_policy"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from hybridllm.local.fingerprint import cpu_fingerprint

    if policy not in ("active", "passive") or data.get("cpu") != cpu_fingerprint():
        return None
    return dict(data)


def choose() -> str:
    """The policy this process should use (see the module docstring for the order)."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    data = stored()
    return str(data["omp_wait_policy"]).upper() if data is not None else "PASSIVE"


def choose_safely() -> str:
    """`choose()`, or passive where the cache cannot be read: a broken cache never breaks a load."""
    try:
        return choose()
    except Exception:
        return "PASSIVE"


def apply() -> str:
    """Set `OMP_WAIT_POLICY` for this process unless already set; returns the value in force.
    Called by `loader.llama_cpp()` just before llama.cpp loads, and by nothing else."""
    if not os.environ.get(ENV):
        os.environ[ENV] = choose_safely()
    return os.environ[ENV]


def save(policy: Policy, measured: dict[str, dict[str, float]], *, dedicated: bool) -> Path:
    """Store the device's choice with what it was measured on."""
    from hybridllm.local.fingerprint import cpu_fingerprint, llama_build

    path = device_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "omp_wait_policy": policy,
        "dedicated": dedicated,
        "measured": measured,
        "cpu": cpu_fingerprint(),
        "llama_cpp": llama_build(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


def measure(
    model_path: Path, policy: Policy, settings_json: str, *, quick: bool = False
) -> dict[str, float]:
    """Prefill and decode tokens/s of the model under `policy`, in a fresh subprocess."""
    from hybridllm.errors import TuneError

    env = {**os.environ, ENV: policy.upper()}
    cmd = [sys.executable, "-m", "hybridllm.local.probe", str(model_path), settings_json]
    if quick:
        cmd.append("--quick")
    try:
        out = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True
        )
        rates = json.loads(out.stdout.strip().splitlines()[-1])
        return {k: float(rates[k]) for k in ("prefill_tps", "decode_tps")}
    except subprocess.TimeoutExpired as exc:
        raise TuneError(f"measuring {policy} waiting took over {PROBE_TIMEOUT_S:.0f} s",
                        path=model_path) from exc  # fmt: skip
    except (subprocess.CalledProcessError, ValueError, KeyError, IndexError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise TuneError(f"measuring {policy} waiting failed: {str(detail)[-300:]}",
                        path=model_path) from exc  # fmt: skip


REFERENCE_REQUEST = (256, 128)
"""(prompt tokens, output tokens) of the request whose time `pick` compares."""
MAX_PREFILL_LOSS = 0.10


def pick(measured: dict[str, dict[str, float]], *, dedicated: bool, min_gain: float) -> Policy:
    """Active only on a dedicated device where it serves a reference request (256 prompt
    tokens, 128 output tokens) faster by more than `min_gain`, and prefills at most
    `MAX_PREFILL_LOSS` slower (the first token must not suffer for a faster tail)."""
    a, p = measured.get("active"), measured.get("passive")
    if not dedicated or a is None or p is None:
        return "passive"
    faster = _request_s(a) < _request_s(p) * (1 - min_gain)
    no_slower = a["prefill_tps"] >= p["prefill_tps"] * (1 - MAX_PREFILL_LOSS)
    return "active" if faster and no_slower else "passive"


def _request_s(rates: dict[str, float]) -> float:
    prompt, output = REFERENCE_REQUEST
    pre, dec = rates["prefill_tps"], rates["decode_tps"]
    return prompt / pre + output / dec if pre > 0 and dec > 0 else float("inf")
