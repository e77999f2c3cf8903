"""Unit tests of the disk store of KV states (`engines.llama.kvdisk`): a state comes back as it
was written; another identity's file is not read; a corrupt, cut or tampered file is a miss and
is removed; the budget holds. No model: the states' bytes are placeholders (the real restore is
in tests/integration/test_kv_store.py)."""

from __future__ import annotations

from pathlib import Path

from hybridllm.engines.llama.kvdisk import DiskStates

SYS = list(range(500, 600))


def test_a_state_comes_back_as_written_after_a_restart(tmp_path: Path) -> None:
    DiskStates(tmp_path, "model-a", 10**6).write(SYS, b"\x01\x02\x03" * 100)
    again = DiskStates(tmp_path, "model-a", 10**6)  # a new process
    found = again.find([*SYS, 7, 8, 9], min_tokens=64)
    assert found is not None and found[1] == 100
    assert again.read(found[0]) == bytearray(b"\x01\x02\x03" * 100) and again.has(SYS)


def test_another_models_file_is_neither_read_nor_removed(tmp_path: Path) -> None:
    DiskStates(tmp_path, "model-a", 10**6).write(SYS, b"x" * 10)
    other = DiskStates(tmp_path, "model-b", 10**6)
    assert other.find(SYS, min_tokens=8) is None
    assert len(list(tmp_path.glob("*.kv"))) == 1


def test_a_tampered_or_cut_file_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    store = DiskStates(tmp_path, "m", 10**6)
    store.write(SYS, b"y" * 1000)
    path = next(tmp_path.glob("*.kv"))
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit in the data: the checksum says so
    path.write_bytes(bytes(raw))
    again = DiskStates(tmp_path, "m", 10**6)
    found = again.find(SYS, min_tokens=8)
    assert found is not None and again.read(found[0]) is None
    assert not path.exists() and again.find(SYS, min_tokens=8) is None
    store.write(SYS, b"y" * 1000)
    path.write_bytes(path.read_bytes()[:200])  # cut short (a crash mid-copy)
    assert DiskStates(tmp_path, "m", 10**6).find(SYS, min_tokens=8) is None
    assert not path.exists()


def test_the_disk_budget_drops_the_least_recently_used(tmp_path: Path) -> None:
    store = DiskStates(tmp_path, "m", 3500)  # two files of about 1,600 bytes
    for i in range(3):
        store.write([i, *SYS], b"z" * 1000)
    assert sum(p.stat().st_size for p in tmp_path.glob("*.kv")) <= 3500
    assert len(store.states) == 2 and store.find([0, *SYS], min_tokens=8) is None
    assert not list(tmp_path.glob("*.tmp*"))  # written whole, then renamed
