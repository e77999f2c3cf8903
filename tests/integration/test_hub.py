"""Models named on the Hugging Face hub, through the real `huggingface_hub` against a loopback
server that speaks the hub's download API (`hub_server.py`), serving the SmolLM2 GGUF the tests
already use; and the real llama.cpp's refusals (a model too big, truncated, of an architecture it
cannot run). Never the real hub.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest

from hybridllm import HybridClient
from hybridllm.cli import main as cli
from hybridllm.engines.llamacpp import LlamaCppEngine
from hybridllm.errors import (
    HubError,
    InvalidArgumentError,
    ModelCorruptError,
    ModelNotFoundError,
    ModelTooLargeError,
    ModelUnsupportedError,
)
from hybridllm.local import fit, hub, models
from hybridllm.local.resolve import resolve_model
from hybridllm.local.tune import tuning_path
from tests.integration.hub_server import HubState, Repo, hub_server

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "smollm2-135m-instruct-q4_1.gguf"
QUANT_REF = f"hf://{REPO}:Q4_1"
FILE_REF = f"hf://{REPO}/{FILE}"


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_path: Path
            ) -> Iterator[tuple[HubState, Path]]:  # fmt: skip
    """A loopback hub serving SmolLM2 (and a few files to refuse), an empty hub cache and an
    empty hybridllm cache; no stored token, online."""
    notes = tmp_path / "notes.gguf"
    notes.write_text("a text file, named like a model\n" * 10)
    repos = {
        REPO: Repo({FILE: model_path, "notes.gguf": notes, "README.md": notes}),
        "meta-llama/Gated-GGUF": Repo({FILE: model_path}, gated_token="hf_secret"),
    }
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path / "hybridllm-cache"))
    with hub_server(repos) as (url, state):
        monkeypatch.setenv("HF_ENDPOINT", url)
        # what huggingface_hub read at its import, as if HF_ENDPOINT had been set then: its
        # own best-effort calls (the registry of agent harnesses it fetches once a day) come
        # here too, never to the real hub
        constants = huggingface_hub.constants
        monkeypatch.setattr(constants, "ENDPOINT", url)
        template = url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        yield state, model_path


def _downloads(state: HubState) -> int:
    return sum(1 for method, path, _ in state.log if method == "GET" and "/resolve/" in path)


def _ranges(state: HubState) -> list[int]:
    """Where each download that asked for a range started."""
    return [
        int(r.removeprefix("bytes=").rstrip("-"))
        for method, path, r in state.log
        if method == "GET" and "/resolve/" in path and r
    ]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_reports_progress_checks_the_sha_and_is_listed(
    hub_env: tuple[HubState, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    state, original = hub_env
    events: list[tuple[str, int, int]] = []
    path = hub.fetch(QUANT_REF, progress=lambda *e: events.append(e))
    assert path.name == FILE and _sha(path) == _sha(original)
    size = original.stat().st_size
    assert events[0] == ("download", 0, size) and events[-1] == ("download", size, size)
    assert [e[1] for e in events] == sorted(e[1] for e in events) and len(events) > 2
    # the same file by its name, from the cache: no second download
    gets = sum(1 for m, p, _ in state.log if m == "GET" and "/resolve/" in p)
    assert hub.fetch(FILE_REF) == path
    assert sum(1 for m, p, _ in state.log if m == "GET" and "/resolve/" in p) == gets
    assert resolve_model(FILE_REF) == path  # cached: `models path` needs no network
    assert cli.main(["models", "pull", FILE_REF]) == 0  # with its progress bar (on stderr)
    assert capsys.readouterr().out.strip() == str(path)
    assert cli.main(["models", "list"]) == 0
    listed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(FILE_REF)]
    assert len(listed) == 1 and str(path) in listed[0] and "98 MB" in listed[0]


def test_a_pull_cut_midway_resumes_where_it_broke_off(hub_env: tuple[HubState, Path]) -> None:
    state, original = hub_env
    size = original.stat().st_size
    state.cut_at = size // 3  # the connection drops a third of the way in
    events: list[tuple[str, int, int]] = []
    path = hub.fetch(QUANT_REF, progress=lambda *e: events.append(e))
    assert _sha(path) == _sha(original)
    # the same pull asked for the rest only, and the bar neither restarted nor overshot
    (start,) = _ranges(state)
    assert 0 < start <= size // 3  # what had been written when the connection dropped
    assert events[-1] == ("download", size, size) and max(e[1] for e in events) == size
    assert not list(Path(hub.hub_cache_dir()).rglob("*.partial"))


def test_a_pull_that_breaks_off_resumes_at_the_next_pull(hub_env: tuple[HubState, Path]) -> None:
    state, original = hub_env
    size = original.stat().st_size
    state.cut_at, state.down_after_cut = size // 3, True  # and the hub stays down
    with pytest.raises(HubError) as err:
        hub.fetch(QUANT_REF)
    assert err.value.reason == "network" and err.value.ref == QUANT_REF
    (partial,) = Path(hub.hub_cache_dir()).rglob("*.partial")  # kept for the next pull
    kept = partial.stat().st_size
    assert 0 < kept <= size // 3
    assert not hub.list_cached() and hub.cached(QUANT_REF) is None
    state.down = False
    events: list[tuple[str, int, int]] = []
    path = hub.fetch(QUANT_REF, progress=lambda *e: events.append(e))  # a later run
    assert _sha(path) == _sha(original) and not partial.exists()
    assert _ranges(state)[-1] == kept and events[0] == ("download", kept, size)


def test_a_corrupt_download_is_refused_and_removed(hub_env: tuple[HubState, Path]) -> None:
    state, _ = hub_env
    state.corrupt.add(FILE)
    with pytest.raises(HubError) as err:
        hub.fetch(QUANT_REF)
    assert err.value.reason == "checksum" and err.value.ref == QUANT_REF
    leftovers = [p for p in Path(hub.hub_cache_dir()).rglob("*") if p.is_file() or p.is_symlink()]
    assert not [p for p in leftovers if "blobs" in p.parts or "snapshots" in p.parts]
    state.corrupt.clear()
    assert hub.fetch(QUANT_REF).is_file()  # the next pull fetches it whole


def test_hub_errors_are_typed_by_reason(
    hub_env: tuple[HubState, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {
        "hf://meta-llama/Gated-GGUF:Q4_1": "gated",
        "hf://nobody/Missing-GGUF:Q4_1": "repo_not_found",
        f"hf://{REPO}/missing.gguf": "file_not_found",
        f"hf://{REPO}:Q8_0": "file_not_found",
        f"hf://{REPO}/notes.gguf": "not_gguf",  # downloaded whole, not a model
        f"hf://{REPO}/README.md": "not_gguf",  # refused before any download
    }
    for ref, reason in cases.items():
        with pytest.raises(HubError) as err:
            hub.fetch(ref)
        assert (err.value.ref, err.value.reason) == (ref, reason)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # the gated repository's token
    assert hub.fetch("hf://meta-llama/Gated-GGUF:Q4_1").is_file()
    with pytest.raises(InvalidArgumentError):
        LlamaCppEngine("hf://only-an-owner")
    with pytest.raises(ModelNotFoundError):  # not pulled, and `pull` not asked
        resolve_model(f"hf://{REPO}/other.gguf")


def test_offline_mode_serves_the_cache_and_names_what_is_missing(
    hub_env: tuple[HubState, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = hub.fetch(QUANT_REF)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing there
    assert hub.fetch(QUANT_REF) == path and hub.fetch(FILE_REF) == path
    with pytest.raises(HubError) as err:
        hub.fetch("hf://meta-llama/Gated-GGUF:Q4_1")
    assert err.value.reason == "offline_missing"


async def test_an_engine_opens_a_hub_model_tunes_it_once_and_answers(
    hub_env: tuple[HubState, Path],
) -> None:
    events: list[tuple[str, int, int]] = []
    engine = LlamaCppEngine(QUANT_REF, n_ctx=512, progress=lambda *e: events.append(e))
    async with HybridClient(local=engine) as client:
        answer = await client.complete("Say hi.", max_tokens=4)
    assert answer.trace.engine == "local" and answer.text
    assert engine.model_id == FILE
    assert engine.tuning is not None  # measured at the first open, and stored
    assert {e[0] for e in events} >= {"download", "loading"}
    stored = tuning_path(hub.fetch(QUANT_REF))
    assert stored.is_relative_to(models.cache_dir())  # not written into the hub's cache
    written, gets = stored.stat().st_mtime_ns, _downloads(hub_env[0])
    again = LlamaCppEngine(QUANT_REF, n_ctx=512)
    await again.start()
    try:  # the second open finds the file and the tuning: no download, no measuring
        assert again.tuning is not None and again.tuning.settings == engine.tuning.settings
        assert stored.stat().st_mtime_ns == written and _downloads(hub_env[0]) == gets
    finally:
        await again.aclose()


async def test_a_hub_model_too_big_for_the_device_is_refused_before_any_download(
    hub_env: tuple[HubState, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, original = hub_env
    monkeypatch.setattr(fit, "available_memory", lambda: 50 << 20)  # a 50 MB device
    with pytest.raises(ModelTooLargeError) as err:
        await LlamaCppEngine(QUANT_REF, use_tuning=False).start()
    e = err.value
    assert (e.weights_bytes, e.available_bytes) == (original.stat().st_size, 50 << 20)
    assert _downloads(state) == 0 and not hub.list_cached()


async def test_llama_cpp_refusals_are_typed_with_their_figures(
    tmp_path: Path, model_path: Path
) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=8_000_000, use_tuning=False)
    with pytest.raises(ModelTooLargeError) as err:
        await engine.start()  # refused before llama.cpp allocates anything
    e = err.value
    assert e.n_ctx == 8_000_000 and e.need_bytes > e.available_bytes > 0
    assert e.kv_bytes > 100 * (1 << 30) and e.weights_bytes < 200 * (1 << 20)
    # the same estimate from the command line: exit 1 where it does not fit, 0 where it does
    assert cli.main(["models", "fit", str(model_path), "--n-ctx", "8000000"]) == 1
    assert cli.main(["models", "fit", str(model_path), "--n-ctx", "2048"]) == 0

    cut = tmp_path / "cut.gguf"
    raw = model_path.read_bytes()  # noqa: ASYNC240 (a test's setup)
    cut.write_bytes(raw[: len(raw) // 2])  # noqa: ASYNC240
    with pytest.raises(ModelCorruptError) as corrupt:
        await LlamaCppEngine(cut, use_tuning=False, fit_check=False).start()
    assert corrupt.value.reason == "truncated"

    alien = tmp_path / "alien.gguf"
    key = b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama"
    assert raw.count(key) == 1
    alien.write_bytes(raw.replace(key, key[:-5] + b"zzzzz"))
    with pytest.raises(ModelUnsupportedError) as unsupported:
        await LlamaCppEngine(alien, use_tuning=False, fit_check=False).start()
    assert unsupported.value.architecture == "zzzzz"
