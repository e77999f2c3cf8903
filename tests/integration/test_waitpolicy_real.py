"""The wait-policy measurement on the real model: one fresh process per policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hybridllm.errors import TuneError
from hybridllm.local import waitpolicy
from hybridllm.local.settings import DEFAULT_SETTINGS


def test_measure_runs_the_real_model_under_each_policy(model_path: Path) -> None:
    settings = json.dumps(dataclasses.asdict(DEFAULT_SETTINGS.resolved()))
    rates = waitpolicy.measure(model_path, "bounded", settings, quick=True)
    assert rates["prefill_tps"] > 0 and rates["decode_tps"] > 0
    assert 0.0 <= rates["idle_cpu_pct"] < 50.0  # bounded spinning sleeps once idle
    with pytest.raises(TuneError, match="failed"):
        waitpolicy.measure(model_path.parent / "missing.gguf", "passive", settings, quick=True)
