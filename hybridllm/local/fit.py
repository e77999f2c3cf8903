"""Does a model fit this device at the asked context? An estimate from the GGUF's own metadata,
checked before llama.cpp loads it (so a model too big is a `ModelTooLargeError` with the figures,
not an out-of-memory kill), as LM Studio's `--estimate-only` does.

need = weights (the tensors' bytes) + KV cache (n_ctx x layers x (K + V) heads x head size x
the cache type's bytes) + compute buffers (the logits of a batch, and a fixed margin). Free
memory: Linux's `MemAvailable`, lowered to a cgroup's limit where the process runs in one;
elsewhere the free physical pages. Where free memory cannot be read, nothing is refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hybridllm.errors import ModelTooLargeError
from hybridllm.local.gguf import GGUFHeader, read_header

log = logging.getLogger("hybridllm.local")

MARGIN_BYTES = 64 << 20  # llama.cpp's graph and scratch buffers beyond the logits, roughly
# bytes per element of the KV cache by `type_k` / `type_v` (llama.cpp's default: f16)
CACHE_TYPE_BYTES = {0: 4.0, 1: 2.0, 8: 34 / 32, 2: 18 / 32, 3: 20 / 32, 30: 2.0}


@dataclass(frozen=True)
class Fit:
    """The estimate, in bytes (`available_bytes`: None where it cannot be read)."""

    n_ctx: int
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    available_bytes: int | None
    context_length: int | None  # the context the model was trained for (GGUF metadata)

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.need_bytes <= self.available_bytes


def kv_bytes(header: GGUFHeader, n_ctx: int, type_k: int = 1, type_v: int = 1) -> int:
    """The KV cache's bytes at `n_ctx` (0 for a model whose metadata has no attention)."""
    layers = header.arch_int("block_count") or 0
    embd = header.arch_int("embedding_length") or 0
    heads = header.arch_int("attention.head_count") or 0
    kv_heads = header.arch_int("attention.head_count_kv") or heads
    if not (layers and embd and heads):
        return 0
    k_dim = header.arch_int("attention.key_length") or embd // heads
    v_dim = header.arch_int("attention.value_length") or embd // heads
    per_token = kv_heads * (
        k_dim * CACHE_TYPE_BYTES.get(type_k, 2.0) + v_dim * CACHE_TYPE_BYTES.get(type_v, 2.0)
    )
    return int(n_ctx * layers * per_token)


def estimate(
    path: Path, n_ctx: int, *, n_batch: int = 512, type_k: int = 1, type_v: int = 1
) -> Fit:
    """What loading the GGUF at `path` with `n_ctx` needs, and what is free."""
    header = read_header(path)
    vocab = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    compute = 4 * vocab * min(n_batch, n_ctx) + MARGIN_BYTES
    return Fit(
        n_ctx=n_ctx,
        weights_bytes=header.weights_bytes,
        kv_bytes=kv_bytes(header, n_ctx, type_k, type_v),
        compute_bytes=compute,
        available_bytes=available_memory(),
        context_length=header.arch_int("context_length"),
    )


def check_fit(
    path: Path, n_ctx: int, *, n_batch: int = 512, type_k: int = 1, type_v: int = 1
) -> Fit:
    """`estimate`, and `ModelTooLargeError` where the need passes the free memory."""
    fit = estimate(path, n_ctx, n_batch=n_batch, type_k=type_k, type_v=type_v)
    if fit.context_length and n_ctx > fit.context_length:
        log.warning(
            "n_ctx %d is past the %d tokens %s was trained for: answers past that degrade",
            n_ctx,
            fit.context_length,
            path.name,
        )
    if not fit.fits:
        assert fit.available_bytes is not None
        raise ModelTooLargeError(
            f"the model needs about {_gib(fit.need_bytes)} at n_ctx {n_ctx} (weights "
            f"{_gib(fit.weights_bytes)}, KV cache {_gib(fit.kv_bytes)}, buffers "
            f"{_gib(fit.compute_bytes)}) and {_gib(fit.available_bytes)} is free: ask a smaller "
            "n_ctx, a smaller quantization, or free memory",
            path=path,
            need_bytes=fit.need_bytes,
            available_bytes=fit.available_bytes,
            weights_bytes=fit.weights_bytes,
            kv_bytes=fit.kv_bytes,
            n_ctx=n_ctx,
        )
    return fit


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def available_memory() -> int | None:
    """Bytes this process may still take: `MemAvailable`, under a cgroup v2 limit if any."""
    free = _meminfo_available()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    room = _cgroup_room()
    return min(free, room) if room is not None else free


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The cgroup v2 limit less its usage (less the page cache it may reclaim, as `docker
    stats` counts it), where the process's cgroup has a limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        used = (root / "memory.current").read_text().strip()
        stat = (root / "memory.stat").read_text()
    except OSError:
        return None
    if limit == "max" or not limit.isdigit() or not used.isdigit():
        return None
    reclaimable = 0
    for line in stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "inactive_file" and value.strip().isdigit():
            reclaimable = int(value)
    return max(int(limit) - int(used) + reclaimable, 0)
