"""`LlamaSettings`: the llama.cpp knobs that decide local speed, with defaults measured here.

Defaults (2-core AVX-512 VM shared with other work; `benchmarks/bench_builds.py --setting ...`,
figures in the README): every core for decode and for prompt batches, flash attention on,
n_batch 512 with micro-batches of 128 (prefilled a 256-token prompt 1.8x faster than 512 on
busy cores, same CPU time per token), f16 KV cache (q8_0 saves memory, no faster here), the
model memory-mapped and not locked (neither changed speed measurably). `hybridllm tune`
measures them again on the user's device and stores the winners beside the model
(`hybridllm.local.tune`); explicit settings override both.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

KvType = Literal["f16", "q8_0"]
_GGML_TYPES: dict[str, int] = {"f16": 1, "q8_0": 8}  # ggml_type enum values


def cpu_threads() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LlamaSettings:
    """Speed settings for one loaded model. `None` threads mean every core."""

    n_threads: int | None = None  # decode (one token at a time)
    n_threads_batch: int | None = None  # prompt processing
    n_batch: int = 512  # logical batch: tokens handed to llama_decode at once
    n_ubatch: int = 128  # physical batch computed at once (<= n_batch)
    flash_attn: bool = True
    kv_type: KvType = "f16"  # K and V cache element type; q8_0 needs flash attention
    use_mmap: bool = True
    use_mlock: bool = False

    def replace(self, **changes: Any) -> LlamaSettings:
        return dataclasses.replace(self, **changes)

    def resolved(self) -> LlamaSettings:
        """With thread counts filled in and n_ubatch clamped to n_batch."""
        n = cpu_threads()
        return self.replace(
            n_threads=self.n_threads or n,
            n_threads_batch=self.n_threads_batch or self.n_threads or n,
            n_ubatch=min(self.n_ubatch, self.n_batch),
        )

    def llama_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `llama_cpp.Llama`."""
        s = self.resolved()
        kv = _GGML_TYPES[s.kv_type]
        return {
            "n_threads": s.n_threads,
            "n_threads_batch": s.n_threads_batch,
            "n_batch": s.n_batch,
            "n_ubatch": s.n_ubatch,
            "flash_attn": s.flash_attn or s.kv_type != "f16",
            "type_k": kv,
            "type_v": kv,
            "use_mmap": s.use_mmap,
            "use_mlock": s.use_mlock,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaSettings:
        """Build from a dict, ignoring unknown keys; raises TypeError/ValueError on bad values."""
        names = {f.name for f in dataclasses.fields(cls)}
        s = cls(**{k: v for k, v in data.items() if k in names})
        s._check()
        return s

    def _check(self) -> None:
        for name in ("n_threads", "n_threads_batch"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {v!r}")
        for name in ("n_batch", "n_ubatch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if self.kv_type not in _GGML_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(_GGML_TYPES)}, not {self.kv_type!r}")
        for name in ("flash_attn", "use_mmap", "use_mlock"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false")


DEFAULT_SETTINGS = LlamaSettings()
