"""The OpenMP wait policy: environment first, then the device's stored choice, else passive;
`pick()` allows spinning only on a dedicated device where it measured faster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridllm.local import waitpolicy
from hybridllm.local.fingerprint import cpu_fingerprint

ROOT = Path(__file__).resolve().parents[2]
FAST = {"active": {"prefill_tps": 240.0, "decode_tps": 27.0},
        "passive": {"prefill_tps": 230.0, "decode_tps": 18.0}}  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    return tmp_path


def test_pick_spins_only_when_dedicated_and_faster() -> None:
    assert waitpolicy.pick(FAST, dedicated=True, min_gain=0.03) == "active"
    assert waitpolicy.pick(FAST, dedicated=False, min_gain=0.03) == "passive"
    slower = {**FAST, "active": {"prefill_tps": 240.0, "decode_tps": 18.2}}
    assert waitpolicy.pick(slower, dedicated=True, min_gain=0.03) == "passive"
    worse_prefill = {**FAST, "active": {"prefill_tps": 150.0, "decode_tps": 30.0}}
    assert waitpolicy.pick(worse_prefill, dedicated=True, min_gain=0.03) == "passive"
    # measured for an IQ4_NL variant: 6% less prefill (noise-sized) for 56% more decode
    iq4 = {
        "passive": {"prefill_tps": 316.4, "decode_tps": 19.0},
        "active": {"prefill_tps": 298.3, "decode_tps": 29.7},
    }
    assert waitpolicy.pick(iq4, dedicated=True, min_gain=0.03) == "active"
    assert waitpolicy.pick({}, dedicated=True, min_gain=0.03) == "passive"


def test_default_is_passive(cache: Path) -> None:
    assert waitpolicy.stored() is None
    assert waitpolicy.choose() == "PASSIVE"


def test_stored_choice_applies_on_this_cpu_only(cache: Path) -> None:
    path = waitpolicy.save("active", FAST, dedicated=True)
    assert path == cache / "device.json"
    assert waitpolicy.choose() == "ACTIVE"
    data = json.loads(path.read_text())
    assert data["cpu"] == cpu_fingerprint() and data["measured"] == FAST
    data["cpu"] = "another-cpu"
    path.write_text(json.dumps(data))
    assert waitpolicy.stored() is None and waitpolicy.choose() == "PASSIVE"


@pytest.mark.parametrize("text", ["{not json", '{"omp_wait_policy": "turbo"}', "[]", ""])
def test_a_broken_device_file_means_passive(cache: Path, text: str) -> None:
    (cache / "device.json").write_text(text)
    assert waitpolicy.choose() == "PASSIVE"


def test_environment_wins(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    waitpolicy.save("active", FAST, dedicated=True)
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert waitpolicy.choose() == "passive" and waitpolicy.apply() == "passive"


def _policy_llama_cpp_sees(env: dict[str, str], fake: Path) -> str:
    """What a stand-in `llama_cpp` package reads from the environment when it is imported, after
    `import hybridllm` (which must set nothing and load nothing) and `loader.llama_cpp()`."""
    code = ("import os, sys, hybridllm; before = os.environ.get('OMP_WAIT_POLICY'); "
            "assert 'llama_cpp' not in sys.modules; from hybridllm.local import loader; "
            "print(before, loader.llama_cpp().SEEN)")  # fmt: skip
    path = f"{fake}{os.pathsep}{ROOT}"
    run = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": path},
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    before, seen = run.stdout.split()
    assert before == env.get("OMP_WAIT_POLICY", "None")  # importing hybridllm changed nothing
    return seen


def test_the_loader_sets_the_policy_before_llama_cpp_loads(cache: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "llama_cpp").mkdir(parents=True)
    (fake / "llama_cpp" / "__init__.py").write_text(
        "import os\nSEEN = os.environ.get('OMP_WAIT_POLICY')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _policy_llama_cpp_sees(env, fake) == "PASSIVE"
    waitpolicy.save("active", FAST, dedicated=True)
    assert _policy_llama_cpp_sees(env, fake) == "ACTIVE"
    assert _policy_llama_cpp_sees({**env, "OMP_WAIT_POLICY": "passive"}, fake) == "passive"
