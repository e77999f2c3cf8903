"""The GGUF header reader, the fit check and the hub's name rules, on GGUF files written here.

(The real model files, the hub's download API and llama.cpp's refusals: tests/integration/
test_hub.py.)
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybridllm.errors import (
    HubError,
    InvalidArgumentError,
    ModelCorruptError,
    ModelTooLargeError,
)
from hybridllm.local import fit, gguf, hub
from hybridllm.local.hub import HubFile
from hybridllm.runtime.plans.cascade import warn_foreign_stage2


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", kind) + payload


def write_gguf(path: Path, *, layers: int = 4, embd: int = 64, heads: int = 4, kv_heads: int = 2,
               vocab: int = 10, cut: int = 0, arch: str = "llama") -> Path:  # fmt: skip
    """A small GGUF v3: architecture metadata, a token array, two Q8_0 and F32 tensors."""
    tokens = struct.pack("<IQ", 8, vocab) + b"".join(_str(f"t{i}") for i in range(vocab))
    kvs = [
        _kv("general.architecture", 8, _str(arch)),
        _kv(f"{arch}.block_count", 4, struct.pack("<I", layers)),
        _kv(f"{arch}.embedding_length", 4, struct.pack("<I", embd)),
        _kv(f"{arch}.attention.head_count", 4, struct.pack("<I", heads)),
        _kv(f"{arch}.attention.head_count_kv", 4, struct.pack("<I", kv_heads)),
        _kv(f"{arch}.context_length", 4, struct.pack("<I", 4096)),
        _kv("general.flag", 7, struct.pack("<?", True)),
        _kv("general.ratio", 12, struct.pack("<d", 0.5)),
        _kv("tokenizer.ggml.tokens", 9, tokens),
    ]
    q8 = (embd * embd // 32) * 34  # Q8_0: 32 elements in 34 bytes
    tensors = [("a.weight", (embd, embd), 8, 0), ("b.weight", (embd,), 0, q8 + 32 - q8 % 32)]
    infos = b"".join(
        _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        + struct.pack("<IQ", kind, offset)
        for name, shape, kind, offset in tensors
    )  # fmt: skip
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % 32)
    data_end = tensors[1][3] + embd * 4
    body = head + b"\x01" * data_end
    path.write_bytes(body[: len(body) - cut])
    return path


def test_the_header_gives_metadata_tensors_and_their_bytes(tmp_path: Path) -> None:
    h = gguf.read_header(write_gguf(tmp_path / "m.gguf", vocab=1000))
    assert h.version == 3 and h.architecture == "llama"
    assert h.arch_int("block_count") == 4 and h.arch_int("attention.head_count_kv") == 2
    assert h.metadata["general.flag"] is True and h.metadata["general.ratio"] == 0.5
    assert h.array_lengths == {"tokenizer.ggml.tokens": 1000}
    assert [t.nbytes for t in h.tensors] == [64 * 64 // 32 * 34, 64 * 4]
    assert h.end == h.file_size  # the last tensor ends where the file does
    assert h.data_offset % 32 == 0


def test_broken_files_are_told_apart_by_reason(tmp_path: Path) -> None:
    whole = write_gguf(tmp_path / "whole.gguf")
    assert gguf.diagnose(whole) is None
    cut = gguf.diagnose(write_gguf(tmp_path / "cut.gguf", cut=100))
    assert cut is not None and cut.reason == "truncated"
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights, but they are long enough to be read" * 3)
    assert (gguf.diagnose(text) or ModelCorruptError("", path=text)).reason == "bad_magic"
    header_only = tmp_path / "short.gguf"
    header_only.write_bytes(whole.read_bytes()[:60])  # ends inside the metadata
    broken = gguf.diagnose(header_only)
    assert broken is not None and broken.reason == "malformed"


def test_kv_cache_grows_with_the_context_and_the_fit_check_refuses_with_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "m.gguf", layers=4, embd=64, heads=4, kv_heads=2)
    h = gguf.read_header(path)
    # per token: 4 layers x 2 KV heads x (16 + 16) dims x 2 bytes (f16)
    assert fit.kv_bytes(h, 1000) == 1000 * 4 * 2 * 32 * 2
    assert fit.kv_bytes(h, 1000, type_k=8, type_v=8) < fit.kv_bytes(h, 1000)  # q8_0 cache
    monkeypatch.setattr(fit, "available_memory", lambda: 200 << 20)
    assert fit.check_fit(path, 1000).fits
    with pytest.raises(ModelTooLargeError) as err:
        fit.check_fit(path, 2_000_000)
    e = err.value
    assert e.n_ctx == 2_000_000 and e.available_bytes == 200 << 20
    assert e.kv_bytes == fit.kv_bytes(h, 2_000_000) and e.need_bytes > e.available_bytes
    assert (
        e.need_bytes == e.weights_bytes + e.kv_bytes + fit.estimate(path, 2_000_000).compute_bytes
    )
    monkeypatch.setattr(fit, "available_memory", lambda: None)  # unknown: nothing refused
    assert fit.check_fit(path, 2_000_000).fits


def test_a_cgroup_limit_lowers_the_free_memory(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("600000\n")
    (tmp_path / "memory.stat").write_text("anon 1\ninactive_file 100000\nactive_file 5\n")
    assert fit._cgroup_room(tmp_path) == 500_000  # the reclaimable page cache counted free
    (tmp_path / "memory.max").write_text("max\n")
    assert fit._cgroup_room(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "repo", "revision", "filename", "quant"),
    [
        ("hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "main",
         None, "Q4_K_M"),
        ("hf://bartowski/M-GGUF/sub/m-IQ4_XS.gguf", "bartowski/M-GGUF", "main",
         "sub/m-IQ4_XS.gguf", None),
        ("hf://o/r@v1.0/m.gguf", "o/r", "v1.0", "m.gguf", None),
    ],
)  # fmt: skip
def test_hub_names_parse(
    text: str, repo: str, revision: str, filename: str | None, quant: str | None
) -> None:
    ref = hub.parse(text)
    assert (ref.repo, ref.revision, ref.filename, ref.quant) == (repo, revision, filename, quant)


@pytest.mark.parametrize(
    "text",
    ["hf://", "hf://owner", "hf://owner/repo", "hf://owner/repo/", "hf://o/r:",
     "hf://o/r:Q4 K", "hf://o/r/../x.gguf", "hf:/o/r:Q4_0"],
)  # fmt: skip
def test_bad_hub_names_are_invalid_arguments(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        hub.parse(text)
    assert err.value.argument == "model"


def _files(*names: str) -> list[HubFile]:
    return [HubFile(n, 1, None) for n in names]


def test_a_quantization_picks_its_file_its_shards_or_says_why_not() -> None:
    files = _files("README.md", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-q8_0.gguf",
                   "mmproj-m-Q8_0.gguf", "big/m-Q6_K-00002-of-00002.gguf",
                   "big/m-Q6_K-00001-of-00002.gguf")  # fmt: skip
    pick = lambda text: [f.path for f in hub.choose(hub.parse(text), files)]  # noqa: E731
    assert pick("hf://o/r:q4_k_m") == ["m-Q4_K_M.gguf"]  # case-insensitive, Q4_K_S not matched
    assert pick("hf://o/r:Q8_0") == ["m-q8_0.gguf"]  # the projector is not a model
    assert pick("hf://o/r:Q6_K") == [
        "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"
    ]  # fmt: skip
    assert pick("hf://o/r/big/m-Q6_K-00001-of-00002.gguf")[1].endswith("00002-of-00002.gguf")
    refused = [
        ("hf://o/r:Q4_K", "file_not_found"),
        ("hf://o/r:IQ2_XS", "file_not_found"),
        ("hf://o/r/m.gguf", "file_not_found"),
        ("hf://o/r/README.md", "not_gguf"),
    ]
    for text, reason in refused:
        with pytest.raises(HubError) as err:
            hub.choose(hub.parse(text), files)
        assert (err.value.reason, err.value.ref) == (reason, text)
    with pytest.raises(HubError) as err:
        hub.choose(hub.parse("hf://o/r:Q4_K_M"), [*files, *_files("other/x-Q4_K_M.gguf")])
    assert err.value.reason == "ambiguous"


def test_a_local_model_not_stage_2s_own_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    router = SimpleNamespace(stage2={"combined": object()}, stage2_model="qwen-a")
    with caplog.at_level(logging.WARNING, logger="hybridllm.routing"):
        assert warn_foreign_stage2(router, [SimpleNamespace(model_id="smol.gguf"), object()])
        assert not warn_foreign_stage2(router, [SimpleNamespace(model_id="qwen-a")])
        assert not warn_foreign_stage2(SimpleNamespace(stage2={}, stage2_model=None),
                                       [SimpleNamespace(model_id="smol.gguf")])  # fmt: skip
    assert len(caplog.records) == 1
