"""How llama.cpp's OpenMP threads wait: spin briefly then sleep, or sleep at once; never spin idle.

llama.cpp (this build) runs its threads with OpenMP, which reads `OMP_WAIT_POLICY` once, when
the library loads: it is a per-process choice made before `llama_cpp` is imported
(`loader.llama_cpp()` calls `apply()` just before it). Measured on a 2-core AMD EPYC (Zen 4),
Qwen2.5-Coder-0.5B, 2 threads (`benchmarks/bench_wait.py`, decode tokens/s):

| setting | quiet cores | CPU while idle | one other core busy |
| --- | --- | --- | --- |
| "bounded": variable unset, libgomp spins a while, then sleeps | 45.5 | 0.2% | 13.7 |
| passive: sleep at once | 27.2 | 0% | 24.3 |
| active: spin forever | 38.9 | 99.9% | 13.8 |

So spinning pays only where the threads have the cores to themselves, and unbounded spinning
("active") is never chosen: it keeps a core at 100% for as long as the process lives, idle or not
(a laptop's battery, a phone's heat). The choice, in order:

1. an `OMP_WAIT_POLICY` already in the environment wins;
2. else the device's stored choice (`device.json` in the model cache, written by
   `hybridllm tune --dedicated`, ignored on another CPU; an "active" stored by an older version
   counts as "bounded");
3. else automatic (`auto`): "bounded" where the engine's threads have cores to themselves (the
   cores busy with other work right now, sampled from /proc/stat over 0.1 s, plus the threads
   fit the usable cores), else passive. The sample is taken once, when llama.cpp loads: a
   machine that gets busy later keeps the choice (set the variable, or run
   `hybridllm tune --dedicated`, where that matters).

`hybridllm tune` measures both settings on the model (`measure()`: one subprocess each, since a
process cannot switch), with the CPU they burn while idle, and stores "bounded" only with
`--dedicated`, only where it is faster and idles at under `MAX_IDLE_CPU_PCT` (see `pick`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Policy = Literal["bounded", "passive"]
ENV = "OMP_WAIT_POLICY"
FILE = "device.json"
PROBE_TIMEOUT_S = 300.0
SAMPLE_S = 0.1
SPARE_CORE = 0.25  # other work up to this many cores still leaves the threads their cores
MAX_IDLE_CPU_PCT = 5.0


@dataclass(frozen=True)
class Choice:
    """The wait setting for this process: `env` is the `OMP_WAIT_POLICY` value to set (None:
    leave it unset, libgomp's bounded spin); `why` says where it came from."""

    policy: str
    env: str | None
    why: str


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

    if policy not in ("active", "bounded", "passive") or data.get("cpu") != cpu_fingerprint():
        return None
    return dict(data)


def auto(cores: int, threads: int, busy_cores: float) -> Policy:
    """Bounded spinning where `threads` fit the `cores` left by `busy_cores` of other work."""
    return "bounded" if threads + busy_cores <= cores + SPARE_CORE else "passive"


def busy_cores(sample_s: float = SAMPLE_S) -> float:
    """Cores busy with other processes' work over a short sample (this process left out);
    0.0 where /proc/stat cannot be read."""

    def read() -> tuple[float, float, float]:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return sum(fields), fields[3] + fields[4], usage.ru_utime + usage.ru_stime

    try:
        total0, idle0, self0 = read()
        t0 = time.monotonic()
        time.sleep(sample_s)
        total1, idle1, self1 = read()
    except (OSError, ValueError, IndexError):
        return 0.0
    ticks, wall = total1 - total0, time.monotonic() - t0
    if ticks <= 0 or wall <= 0:
        return 0.0
    ncpu = os.cpu_count() or 1
    busy = (1.0 - (idle1 - idle0) / ticks) * ncpu
    return max(0.0, busy - (self1 - self0) / wall)


def choose(*, threads: int | None = None, busy: float | None = None) -> Choice:
    """The wait setting this process should use (see the module docstring for the order).
    `threads`: the engine's threads (default: every usable core); `busy`: stated instead of
    sampled (tests)."""
    if os.environ.get(ENV):
        value = os.environ[ENV]
        return Choice(value.lower(), value, f"{ENV}={value} is set in the environment (it wins)")
    data = stored()
    if data is not None:
        was = str(data["omp_wait_policy"])
        policy: Policy = "passive" if was == "passive" else "bounded"
        note = " (stored as active, which spins idle: bounded instead)" if was == "active" else ""
        why = f"{policy}: stored for this CPU by `hybridllm tune --dedicated`{note}"
        return Choice(policy, _env_of(policy), why)
    from hybridllm.local.settings import cpu_threads

    cores = cpu_threads()
    threads = threads or cores
    busy = busy_cores() if busy is None else busy
    policy = auto(cores, threads, busy)
    fits = "fit" if policy == "bounded" else "do not fit"
    return Choice(policy, _env_of(policy),
                  f"{policy}: automatic, {threads} threads {fits} {cores} cores with "
                  f"{busy:.1f} busy with other work")  # fmt: skip


def _env_of(policy: Policy) -> str | None:
    return "PASSIVE" if policy == "passive" else None


def choose_safely(**kw: Any) -> Choice:
    """`choose()`, or passive where the cache cannot be read: a broken cache never breaks a load."""
    try:
        return choose(**kw)
    except Exception as exc:
        return Choice("passive", "PASSIVE", f"passive: the choice failed ({exc!r})")


_applied: Choice | None = None


def apply() -> Choice:
    """Set `OMP_WAIT_POLICY` for this process where the choice needs it (bounded leaves it
    unset); returns the choice in force. Called by `loader.llama_cpp()` just before llama.cpp
    loads, and by nothing else; later calls return the first choice."""
    global _applied
    if _applied is None:
        _applied = choose_safely()
        if _applied.env is not None and not os.environ.get(ENV):
            os.environ[ENV] = _applied.env
    return _applied


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

    env = {k: v for k, v in os.environ.items() if k != ENV}
    if policy == "passive":
        env[ENV] = "PASSIVE"
    cmd = [sys.executable, "-m", "hybridllm.local.probe", str(model_path), settings_json]
    if quick:
        cmd.append("--quick")
    try:
        out = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True
        )
        rates = json.loads(out.stdout.strip().splitlines()[-1])
        return {k: float(rates[k]) for k in ("prefill_tps", "decode_tps", "idle_cpu_pct")}
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
    """Bounded spinning only on a dedicated device where it serves a reference request (256
    prompt tokens, 128 output tokens) faster by more than `min_gain`, prefills at most
    `MAX_PREFILL_LOSS` slower (the first token must not suffer for a faster tail), and burns
    under `MAX_IDLE_CPU_PCT` of a core while idle."""
    b, p = measured.get("bounded"), measured.get("passive")
    if not dedicated or b is None or p is None:
        return "passive"
    faster = _request_s(b) < _request_s(p) * (1 - min_gain)
    no_slower = b["prefill_tps"] >= p["prefill_tps"] * (1 - MAX_PREFILL_LOSS)
    cool = b.get("idle_cpu_pct", 100.0) < MAX_IDLE_CPU_PCT
    return "bounded" if faster and no_slower and cool else "passive"


def _request_s(rates: dict[str, float]) -> float:
    prompt, output = REFERENCE_REQUEST
    pre, dec = rates["prefill_tps"], rates["decode_tps"]
    return prompt / pre + output / dec if pre > 0 and dec > 0 else float("inf")
