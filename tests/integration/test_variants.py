"""Requantized variants `name:quant`: made by the real llama.cpp quantizer from SmolLM2, run by
the real engine, checked against their base and marker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybridllm import HybridClient, LlamaCppEngine
from hybridllm.cli import main as cli
from hybridllm.errors import ConfigError, ModelNotFoundError, PullError
from hybridllm.local import models, resolve, variants
from hybridllm.local.fingerprint import sha256_file

SMOL = "smollm2-135m-instruct"
VARIANT = f"{SMOL}:q4_0"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_path: Path) -> Path:
    """A fresh cache holding a copy of the real SmolLM2 base model (verified on first use)."""
    directory = tmp_path / "cache"
    directory.mkdir()
    shutil.copy(model_path, directory / models.get_manifest(SMOL).file)
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(directory))
    return directory


def _leftovers(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if ".q4_0." in p.name and "lock" not in p.name
    )


def test_split_names() -> None:
    assert variants.split(SMOL) == (SMOL, None)
    assert variants.split(VARIANT) == (SMOL, "q4_0")
    with pytest.raises(ConfigError, match=r"unknown quantization 'q3_x'.*known: q4_0, iq4_nl"):
        variants.split(f"{SMOL}:q3_x")


def test_unmade_variant_says_how_to_make_it(cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=f"run `hybridllm models pull {VARIANT}`"):
        resolve.resolve_model(VARIANT)
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        resolve.resolve_model("nope:q4_0")


@pytest.mark.anyio
@pytest.mark.integration
async def test_made_variant_runs_in_the_engine(cache: Path) -> None:
    path = resolve.resolve_model(VARIANT, pull=True)  # pull makes it
    manifest = models.get_manifest(SMOL)
    assert path == cache / "SmolLM2-135M-Instruct.Q4_1.q4_0.gguf"
    assert variants.is_made(manifest, "q4_0")
    record = json.loads(path.with_name(path.name + ".variant.json").read_text())
    assert record["base_sha256"] == manifest.sha256 and record["quant"] == "q4_0"
    assert record["sha256"] == sha256_file(path)
    assert path.stat().st_size != (cache / manifest.file).stat().st_size
    engine = LlamaCppEngine(VARIANT, n_ctx=512, use_tuning=False)
    async with HybridClient(local=engine) as client:
        result = await client.complete("Say hello.", engine="local", max_tokens=8)
    assert result.text.strip() and result.trace.completion_tokens > 0
    assert engine.info().model == VARIANT


def test_changed_variant_or_base_is_not_used(cache: Path) -> None:
    manifest = models.get_manifest(SMOL)
    path = variants.make(VARIANT)
    with path.open("ab") as fh:  # tampered after making
        fh.write(b"\0")
    assert not variants.is_made(manifest, "q4_0")
    with pytest.raises(ModelNotFoundError):
        resolve.resolve_model(VARIANT)
    path = variants.make(VARIANT)  # made again
    assert variants.is_made(manifest, "q4_0")
    record_path = path.with_name(path.name + ".variant.json")
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "base_sha256": "0" * 64}))  # another base
    assert not variants.is_made(manifest, "q4_0")


def test_failed_quantize_leaves_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_model_quantize", lambda *a: 1)
    with pytest.raises(PullError, match="could not requantize .* to q4_0"):
        variants.make(VARIANT)
    assert _leftovers(cache) == []


def test_cli_pull_makes_the_variant(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "pull", "-q", VARIANT]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(cache / "SmolLM2-135M-Instruct.Q4_1.q4_0.gguf")
    assert cli.main(["models", "pull", VARIANT]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == out and "already made" in captured.err
    assert cli.main(["models", "path", VARIANT]) == 0
    assert capsys.readouterr().out.strip() == out
    assert cli.main(["models", "list"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    row = [VARIANT, "test", "92", "MB", "yes", "made", "here", "from", SMOL, out]
    assert row in listed  # NAME ROLE SIZE PRESENT SOURCE PATH
    assert cli.main(["models", "pull", f"{SMOL}:q9"]) == 2
    assert "unknown quantization" in capsys.readouterr().err
