"""`hybridllm bench --quick` end to end on real models: SmolLM2-135M as the local engine and as
the stand-in cloud (`hybridllm serve-model` on loopback), the JSON's structure and the PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm.cli.main import main
from tests.integration.servers import TEST_MODEL

pytestmark = pytest.mark.integration

PNG = b"\x89PNG\r\n\x1a\n"


def test_bench_quick_writes_the_json_and_the_plots(
    model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out_json, plots = tmp_path / "bench.json", tmp_path / "plots"
    args = ["bench", "--quick", "--local-model", TEST_MODEL, "--cloud-model", TEST_MODEL]
    assert main([*args, "--json", str(out_json), "--plots", str(plots)]) == 0
    data = json.loads(out_json.read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["cloud"]["name"] == TEST_MODEL
    assert data["machine"]["local"]["quantization"] and data["machine"]["llama_cpp"]
    engines = {(r["engine"], r["input_tokens"] >= 1000) for r in data["ttft_vs_input"]}
    assert engines == {("local", False), ("local", True), ("cloud", False), ("cloud", True)}
    assert all(r["ttft_ms"] > 0 for r in data["ttft_vs_input"])
    assert [p["concurrency"] for p in data["concurrency"]] == [1, 2, 4, 8]
    assert all(p["throughput_tps"] > 0 for p in data["concurrency"])
    assert set(data["strategies"]) == {"cloud only", "local only", "policy chat"}
    for name, stats in data["strategies"].items():
        assert stats["counts"]["requests"] == 6, name
        assert stats["ttft_ms"]["p50"] <= stats["ttft_ms"]["p99"]
    assert data["strategies"]["local only"]["counts"]["cloud_share"] == 0.0
    assert data["total_time_check"]["requests"] > 25
    assert data["local_rates"]["prefill_tps"] > 0
    for name in ("ttft_vs_input", "concurrency", "total_time_check", "ttft_cdf"):
        assert (plots / f"{name}.png").read_bytes()[:8] == PNG
    out = capsys.readouterr().out
    assert "TTFT against input length" in out and "mixed workload" in out
