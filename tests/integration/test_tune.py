"""Stored tunings (round trip, staleness), engine settings precedence, and `hybridllm tune` on the
real SmolLM2 model. The model is linked into tmp_path so no tuning lands in the shared cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridllm.engines import LlamaCppEngine
from hybridllm.local import waitpolicy
from hybridllm.local.settings import DEFAULT_SETTINGS, LlamaSettings, cpu_threads
from hybridllm.local.tune import (
    MIN_GAIN,
    Environment,
    Rates,
    Trial,
    Tuning,
    load_tuning,
    read_tuning,
    save_tuning,
    tuning_path,
)

TUNED = LlamaSettings(
    n_threads=1, n_threads_batch=1, n_batch=256, n_ubatch=64, flash_attn=False, kv_type="f16"
)


@pytest.fixture
def model_link(tmp_path: Path, model_path: Path) -> Path:
    link = tmp_path / model_path.name
    link.symlink_to(model_path)
    return link


def make_tuning(model: Path, settings: LlamaSettings = TUNED) -> Tuning:
    return Tuning(
        settings=settings,
        rates=Rates(prefill_tps=321.5, decode_tps=45.25),
        environment=Environment.current(model),
        trials=(Trial("threads=2", 300.0, 44.0), Trial("kv_type=q8_0", 280.0, None)),
        measured_at="2026-11-30T03:00:00Z",
        seconds=12.0,
    )


def test_tuning_round_trip(model_link: Path) -> None:
    tuning = make_tuning(model_link)
    path = save_tuning(model_link, tuning)
    assert path == tuning_path(model_link) == model_link.with_name(model_link.name + ".tune.json")
    assert load_tuning(model_link) == tuning
    assert json.loads(path.read_text())["settings"]["n_ubatch"] == 64


@pytest.mark.parametrize("field", ["llama_cpp", "cpu", "model"])
def test_stale_tuning_is_ignored(model_link: Path, field: str) -> None:
    tuning = make_tuning(model_link)
    env = tuning.environment
    if field == "model":  # another file under the same name: other size/mtime and sha256
        env = dataclasses.replace(env, model_stamp="size=1 mtime_ns=1", model_sha256="0" * 64)
    else:
        env = dataclasses.replace(env, **{field: "something-else"})
    save_tuning(model_link, dataclasses.replace(tuning, environment=env))
    assert read_tuning(model_link) is not None  # still readable for `tune --show`
    assert load_tuning(model_link) is None


def test_moved_mtime_with_same_content_still_applies(model_link: Path) -> None:
    tuning = make_tuning(model_link)
    env = dataclasses.replace(tuning.environment, model_stamp="size=0 mtime_ns=0")
    save_tuning(model_link, dataclasses.replace(tuning, environment=env))
    assert load_tuning(model_link) is not None  # re-hashed: same sha256


@pytest.mark.parametrize("text", ["", "{", '{"format": 99}', '{"format": 1, "settings": {}}'])
def test_malformed_tuning_is_ignored(model_link: Path, text: str) -> None:
    tuning_path(model_link).write_text(text)
    assert load_tuning(model_link) is None


def test_bad_settings_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="kv_type"):
        LlamaSettings.from_dict({"kv_type": "q2"})
    with pytest.raises(ValueError, match="n_ubatch"):
        LlamaSettings.from_dict({"n_ubatch": 0})


def test_settings_resolve_threads_and_kwargs() -> None:
    s = LlamaSettings(n_batch=128, n_ubatch=512, kv_type="q8_0", flash_attn=False).resolved()
    assert s.n_threads == s.n_threads_batch == cpu_threads()
    assert s.n_ubatch == 128
    kw = s.llama_kwargs()
    assert kw["type_k"] == kw["type_v"] == 8
    assert kw["flash_attn"] is True  # a quantized V cache needs flash attention


def _context_settings(engine: LlamaCppEngine) -> tuple[int, int, int, int]:
    session = engine._session
    assert session is not None
    params = session.llm.context_params
    return params.n_threads, params.n_threads_batch, params.n_batch, params.n_ubatch


@pytest.mark.anyio
@pytest.mark.integration
async def test_engine_uses_stored_tuning(model_link: Path) -> None:
    tuning = make_tuning(model_link)
    save_tuning(model_link, tuning)
    engine = LlamaCppEngine(model_link, n_ctx=512)
    try:
        await engine.start()
        assert engine.tuning == tuning
        assert engine.settings == TUNED.resolved()
        assert _context_settings(engine) == (1, 1, 256, 64)
        info = engine.info()
        assert info.prefill_tps == pytest.approx(321.5)
        assert info.decode_tps == pytest.approx(45.25)
    finally:
        await engine.aclose()


@pytest.mark.anyio
@pytest.mark.integration
async def test_explicit_settings_override_tuning(model_link: Path) -> None:
    save_tuning(model_link, make_tuning(model_link))
    engine = LlamaCppEngine(model_link, n_ctx=512, settings=LlamaSettings(n_batch=64), n_threads=1)
    try:
        await engine.start()
        assert engine.tuning is None
        assert engine.settings == DEFAULT_SETTINGS.replace(n_threads=1, n_batch=64).resolved()
        assert _context_settings(engine) == (1, 1, 64, 64)
    finally:
        await engine.aclose()
    engine = LlamaCppEngine(model_link, n_ctx=512, n_batch=512)  # single override on the tuning
    try:
        await engine.start()
        assert engine.tuning is not None
        assert _context_settings(engine) == (1, 1, 512, 64)
        assert engine.info().prefill_tps != pytest.approx(321.5)  # not measured with these
    finally:
        await engine.aclose()


@pytest.mark.integration
def test_tune_command_measures_stores_and_shows(model_link: Path) -> None:
    """`hybridllm tune --quick` on the real model, in a subprocess (tuning drives llama.cpp from
    its main thread; see engines/llama/thread.py)."""
    cache = model_link.parent / "cache"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "HYBRIDLLM_CACHE_DIR": str(cache)}  # fmt: skip
    env.pop("OMP_WAIT_POLICY", None)  # the tests' own setting (conftest) would win over the store
    cmd = [sys.executable, "-m", "hybridllm.cli.main", "tune", str(model_link)]
    run = subprocess.run([*cmd, "--quick", "--dedicated"], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    # both wait settings measured in fresh processes, speed and CPU while idle; with
    # --dedicated the faster one that idles cool is stored (never one that spins while idle)
    device = json.loads((cache / "device.json").read_text())
    measured = device["measured"]
    assert set(measured) == {"bounded", "passive"} and device["dedicated"]
    assert all(r["prefill_tps"] > 0 and r["decode_tps"] > 0 for r in measured.values())
    assert all(0.0 <= r["idle_cpu_pct"] < 50.0 for r in measured.values())
    stored = device["omp_wait_policy"]
    assert stored == waitpolicy.pick(measured, dedicated=True, min_gain=MIN_GAIN)
    assert "bounded waiting: prefill" in run.stdout and "CPU while idle" in run.stdout
    assert f"wait setting: {stored} (stored in" in run.stdout
    assert "tuning" in run.stderr and "/" in run.stderr  # progress lines
    tuning = load_tuning(model_link)
    assert tuning is not None
    assert tuning.prefill_tps > 0 and tuning.decode_tps > 0
    assert any(t.label.startswith("threads=") for t in tuning.trials)
    show = subprocess.run([*cmd, "--show"], env=env, capture_output=True, text=True, timeout=60)
    assert show.returncode == 0
    assert f"prefill: {tuning.prefill_tps:.1f} tokens/s" in show.stdout
    assert f"n_ubatch={tuning.settings.n_ubatch}" in show.stdout
    assert f"{stored}: stored for this CPU" in show.stdout
