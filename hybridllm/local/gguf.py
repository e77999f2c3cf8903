"""A GGUF file's header, read without llama.cpp: its metadata and the extent of its tensors.

What the fit check (`fit`) and the diagnosis of a file llama.cpp refuses need: the scalar
metadata (`general.architecture`, `<arch>.block_count`, ...; arrays are skipped, their lengths
kept), and each tensor's type, shape and offset, so the bytes the weights take and the bytes the
file must hold are known. The header is read through a memory map, so a multi-gigabyte file
costs only the pages of its header. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from hybridllm.errors import ModelCorruptError

Scalar = int | float | bool | str

# value types of the metadata (gguf_type)
_FIXED = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

# ggml_type -> (elements per block, bytes per block), as ggml's type traits
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # from the start of the data section

    @property
    def nbytes(self) -> int | None:
        """The tensor's bytes (None: a type this table does not know)."""
        traits = GGML_TYPES.get(self.ggml_type)
        if traits is None:
            return None
        elements = 1
        for dim in self.shape:
            elements *= dim
        per_block, block_bytes = traits
        return -(-elements // per_block) * block_bytes


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed header. `metadata`: scalar values by key; `array_lengths`: each array's
    length (its elements are not kept); `data_offset`: where the tensor data starts."""

    path: Path
    version: int
    metadata: dict[str, Scalar]
    array_lengths: dict[str, int]
    tensors: tuple[Tensor, ...]
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def arch_int(self, key: str) -> int | None:
        """`<architecture>.<key>` as an int, if the file has it as a scalar."""
        value = self.metadata.get(f"{self.architecture}.{key}")
        return int(value) if isinstance(value, int | float) else None

    @property
    def weights_bytes(self) -> int:
        """The bytes of all tensors (the data section's size where a type is unknown)."""
        sizes = [t.nbytes for t in self.tensors]
        if any(n is None for n in sizes):
            return max(self.file_size - self.data_offset, 0)
        return sum(n for n in sizes if n is not None)

    @property
    def end(self) -> int:
        """The bytes the file must hold: the data section up to the end of its last tensor."""
        ends = [self.data_offset + t.offset + (t.nbytes or 0) for t in self.tensors]
        return max(ends, default=self.data_offset)


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fixed(self, fmt: str) -> Scalar:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise self.broken("the header ends early") from None
        self.pos += struct.calcsize(fmt)
        return value  # type: ignore[no-any-return]

    def u32(self) -> int:
        return int(self.fixed("<I"))

    def u64(self) -> int:
        return int(self.fixed("<Q"))

    def string(self) -> str:
        n = self.u64()
        if self.pos + n > len(self.buf):
            raise self.broken("a string runs past the end of the file")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_array(self) -> int:
        kind, n = self.u32(), self.u64()
        if kind == _STRING:  # tokenizer vocabularies: 10^5 strings, so a tight loop
            pos, buf, unpack = self.pos, self.buf, _U64.unpack_from
            try:
                for _ in range(n):
                    pos += 8 + unpack(buf, pos)[0]
            except struct.error:
                raise self.broken("an array runs past the end of the file") from None
            self.pos = pos
        elif kind in _FIXED:
            self.pos += n * struct.calcsize(_FIXED[kind])
        else:
            raise self.broken(f"an array of unknown type {kind}")
        return n

    def value(self, kind: int) -> Scalar:
        if kind == _STRING:
            return self.string()
        if kind in _FIXED:
            return self.fixed(_FIXED[kind])
        raise self.broken(f"a value of unknown type {kind}")

    def broken(self, why: str) -> ModelCorruptError:
        message = f"malformed GGUF header ({why})"
        return ModelCorruptError(message, path=self.path, reason="malformed")


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`. `ModelCorruptError` ("bad_magic": not a GGUF
    file; "malformed": a header that does not parse); a missing file is an `OSError`."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 24:
            raise ModelCorruptError("not a GGUF file (too short)", path=path, reason="bad_magic")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ModelCorruptError(
                    "not a GGUF file (bad magic)", path=path, reason="bad_magic"
                )
            return _parse(_Cursor(buf, path), size)


def _parse(cur: _Cursor, size: int) -> GGUFHeader:
    cur.pos = 4
    version = cur.u32()
    if version not in (2, 3):
        raise cur.broken(f"version {version}, this reader knows 2 and 3")
    n_tensors, n_kv = cur.u64(), cur.u64()
    metadata: dict[str, Scalar] = {}
    arrays: dict[str, int] = {}
    for _ in range(n_kv):
        key, kind = cur.string(), cur.u32()
        if kind == _ARRAY:
            arrays[key] = cur.skip_array()
        else:
            metadata[key] = cur.value(kind)
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.u32()
        if n_dims > 8:
            raise cur.broken(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cur.u64() for _ in range(n_dims))
        tensors.append(Tensor(name, cur.u32(), shape, cur.u64()))
    align = metadata.get("general.alignment", 32)
    align = int(align) if isinstance(align, int) and int(align) > 0 else 32
    data_offset = -(-cur.pos // align) * align
    return GGUFHeader(cur.path, version, metadata, arrays, tuple(tensors), data_offset, size)


def diagnose(path: Path) -> ModelCorruptError | None:
    """Why a GGUF file that llama.cpp refused is broken, if its header says: not GGUF,
    malformed, or shorter than its tensors ("truncated"). None: the file is whole and well
    formed (so llama.cpp cannot run what it holds)."""
    try:
        header = read_header(path)
    except ModelCorruptError as exc:
        return exc
    if header.file_size < header.end:
        return ModelCorruptError(
            f"truncated GGUF file: {header.file_size} of the {header.end} bytes its tensors "
            "need (an interrupted copy or download: fetch it again)",
            path=path,
            reason="truncated",
        )
    return None
