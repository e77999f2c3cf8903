"""KV states of system prompts on disk: a warm start after a restart (issue 28, part 3).

The first request after an app restarts used to prefill its system prompt again. Now, the
first time the local engine prefills a prompt that opens with a system message of at least
`DISK_MIN_TOKENS` tokens, it stops at the end of that message, copies the sequence's KV cells out
and writes them here; after a restart, a prompt with the same opening reads them back instead
of prefilling them.

A file holds one state: a magic line, a JSON header (the identity, the token count, the data's
CRC-32), the tokens (int32) and llama.cpp's sequence bytes. It is keyed by the identity (the
model file's name, size and mtime, the llama.cpp build, the context settings that shape the
cache) and the tokens, and written to a temporary name then renamed, so a reader sees a whole
file or none. The data's checksum is a CRC-32 (zlib: 2 ms for 4 MB, against 8 ms for sha256 on
the first request's path): it finds a corrupt or cut file; the cache directory is the user's
own, so tampering is not what it guards against. A file whose identity differs is not ours to
read (another model or build: a miss); one whose magic, header, length or checksum is wrong is
corrupt: a miss, and removed. So a stale or broken file is never a wrong answer.

Disk use is bounded by `budget_bytes`; past it the least recently used files go.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from hybridllm.engines.llama.kvstore import Tokens, common_prefix

MAGIC = b"hybridllm-kv-state 2\n"
DISK_MIN_TOKENS = 64  # a system prompt shorter than this is not worth a file
DEFAULT_DISK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True, eq=False)
class DiskState:
    """One file's tokens (read when the directory is opened; its data only when used)."""

    path: Path
    tokens: npt.NDArray[np.int32]


class DiskStates:
    """The states in `directory` whose identity is `identity` (see the module)."""

    def __init__(self, directory: Path, identity: str, budget_bytes: int) -> None:
        self.directory, self.identity, self.budget_bytes = directory, identity, budget_bytes
        self.states: list[DiskState] = []
        self.loaded = self.corrupt = 0
        directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(directory.glob("*.kv")):
            self._index(path)

    def find(self, tokens: Tokens, min_tokens: int) -> tuple[DiskState, int] | None:
        """The state sharing the longest prefix with `tokens` (at least `min_tokens`)."""
        best: tuple[DiskState, int] | None = None
        for state in self.states:
            n = common_prefix(state.tokens, tokens)
            if n >= min_tokens and (best is None or n > best[1]):
                best = (state, n)
        return best

    @staticmethod
    def used_at(state: DiskState) -> int:
        """When the state was last written or read (its file's mtime; 0: gone)."""
        try:
            return state.path.stat().st_mtime_ns
        except OSError:
            return 0

    def has(self, tokens: Tokens) -> bool:
        """A state of exactly these tokens is kept."""
        n = len(tokens)
        return any(len(s.tokens) == n and common_prefix(s.tokens, tokens) == n for s in self.states)

    def read(self, state: DiskState) -> bytearray | None:
        """The state's bytes, checked (None: unreadable or corrupt; the file is removed)."""
        try:
            raw = state.path.read_bytes()
            header, tokens, data = _parse(raw)
        except (OSError, ValueError, KeyError):
            return self._drop(state)
        same = header.get("identity") == self.identity and np.array_equal(tokens, state.tokens)
        if not same or zlib.crc32(data) != header.get("crc32"):
            return self._drop(state)
        os.utime(state.path)  # recently used: kept over older ones
        self.loaded += 1
        return bytearray(data)

    def write(self, tokens: Tokens, data: bytes | bytearray) -> None:
        """Keep a state (atomically: a temporary file renamed), then keep to the budget."""
        ids = np.array(tokens, dtype=np.int32)
        name = hashlib.sha256(self.identity.encode() + ids.tobytes()).hexdigest()[:40]
        path = self.directory / f"{name}.kv"
        header = {"identity": self.identity, "n_tokens": len(ids)}
        header["crc32"] = zlib.crc32(data)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + json.dumps(header).encode() + b"\n" + ids.tobytes() + bytes(data))
        os.replace(tmp, path)
        self.states = [s for s in self.states if s.path != path] + [DiskState(path, ids)]
        self._keep_budget()

    def _index(self, path: Path) -> None:
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(MAGIC) + 4096)
            if not head.startswith(MAGIC):
                raise ValueError("not a state file")
            line = head[len(MAGIC) :].split(b"\n", 1)[0]
            header = json.loads(line)
            if header.get("identity") != self.identity:
                return  # another model or build: not ours to read (nor to remove)
            offset = len(MAGIC) + len(line) + 1
            count = int(header["n_tokens"])
            with open(path, "rb") as fh:
                fh.seek(offset)
                tokens = np.frombuffer(fh.read(4 * count), dtype=np.int32)
            if len(tokens) != count:
                raise ValueError("short file")
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            self.corrupt += 1
            return
        self.states.append(DiskState(path, tokens.copy()))

    def _drop(self, state: DiskState) -> bytearray | None:
        """A corrupt or foreign file where ours was: removed, and a miss."""
        state.path.unlink(missing_ok=True)
        self.states = [s for s in self.states if s is not state]
        self.corrupt += 1
        return None

    def _keep_budget(self) -> None:
        files = sorted(self.directory.glob("*.kv"), key=lambda p: p.stat().st_mtime_ns)
        total = sum(p.stat().st_size for p in files)
        while files and total > self.budget_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)
            self.states = [s for s in self.states if s.path != oldest]


def _parse(raw: bytes) -> tuple[dict[str, object], npt.NDArray[np.int32], bytes]:
    """A file's header, tokens and data (ValueError: not a whole state file)."""
    if not raw.startswith(MAGIC):
        raise ValueError("not a state file")
    line, _, rest = raw[len(MAGIC) :].partition(b"\n")
    header = json.loads(line)
    count = header["n_tokens"]
    if not isinstance(header, dict) or not isinstance(count, int) or len(rest) < 4 * count:
        raise ValueError("bad header or short file")
    tokens = np.frombuffer(rest[: 4 * count], dtype=np.int32)
    return header, tokens, rest[4 * count :]
