"""Requantized variants of a model, made on this machine: `<model name>:<quant>`.

The shipped GGUFs use Q4_K_M. On x86 CPUs llama.cpp repacks Q4_0 and IQ4_NL weights for
its fastest prompt kernels, so these variants prefill faster, at a cost in quality. Measured on
2 AVX-512 cores, Qwen2.5-Coder-0.5B requantized from its Q4_K_M (`benchmarks/bench_quant.py`):
IQ4_NL prefills about 1.35x and Q4_0 1.38x faster; perplexity rises about 6% and 15%. Q8_0 keeps
the quality and speed of the base. Measure on your own device before choosing.

`hybridllm models pull qwen2.5-coder-0.5b-instruct:iq4_nl` makes the variant from the pulled
base model with llama.cpp's own quantizer (nothing is downloaded beyond the base). After that,
`LlamaCppEngine("qwen2.5-coder-0.5b-instruct:iq4_nl")` runs it and `hybridllm tune` tunes it
like any other model.

Files: `<cache>/<base file stem>.<quant>.gguf`, with the cache's usual `.sha256` marker and a
`.variant.json` record (base sha256, quant, the llama-cpp-python build that made it). A variant
whose base model changed, or whose file no longer matches its marker, is not used: it counts as
not made, and a pull makes it again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from hybridllm.errors import ConfigError, ModelNotFoundError, PullError
from hybridllm.local import loader
from hybridllm.local.fingerprint import sha256_file
from hybridllm.local.models import (
    Manifest,
    Progress,
    cache_dir,
    file_lock,
    get_manifest,
    marker_ok,
    marker_path,
    pull,
    write_marker,
)

QUANTS: dict[str, str] = {
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}
"""Quantization name -> the llama_cpp ftype constant that makes it."""


def split(model: str) -> tuple[str, str | None]:
    """("name", "quant") for "name:quant", ("name", None) for a plain name."""
    base, sep, quant = model.partition(":")
    if not sep:
        return model, None
    if quant not in QUANTS:
        known = ", ".join(QUANTS)
        raise ConfigError(f"unknown quantization {quant!r} in {model!r} (known: {known})")
    return base, quant


def variant_path(manifest: Manifest, quant: str) -> Path:
    """Where the variant of `manifest`'s model in `quant` lives (or will live)."""
    return cache_dir() / f"{manifest.file.removesuffix('.gguf')}.{quant}.gguf"


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".variant.json")


def is_made(manifest: Manifest, quant: str) -> bool:
    """Whether the variant exists, was made from this base, and is unchanged since."""
    path = variant_path(manifest, quant)
    try:
        record = json.loads(_record(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    if record.get("base_sha256") != manifest.sha256 or record.get("quant") != quant:
        return False
    sha = record.get("sha256")
    return isinstance(sha, str) and path.is_file() and marker_ok(path, sha)


def _parse(model: str) -> tuple[Manifest, str]:
    """The base's manifest and the quant of "name:quant" (ConfigError otherwise)."""
    base, quant = split(model)
    if quant is None:
        raise ConfigError(f"{model!r} names no variant (expected 'name:quant')")
    return get_manifest(base), quant


def resolve(model: str, *, make_missing: bool = False, progress: Progress | None = None) -> Path:
    """The variant's file; made first if `make_missing`, else ModelNotFoundError if absent."""
    manifest, quant = _parse(model)
    if is_made(manifest, quant):
        return variant_path(manifest, quant)
    if make_missing:
        return make(model, progress=progress)
    raise ModelNotFoundError(
        f"model {model!r} has not been made; run `hybridllm models pull {model}`",
        path=variant_path(manifest, quant),
    )


def make(model: str, *, progress: Progress | None = None, force: bool = False) -> Path:
    """Make the variant `name:quant` from the base model (pulled first if needed).

    On any failure no `.partial` file and no new variant is left behind (PullError).
    """
    manifest, quant = _parse(model)
    dest = variant_path(manifest, quant)
    if not force and is_made(manifest, quant):
        return dest
    source = pull(manifest.name, progress=progress)
    partial = dest.with_name(dest.name + ".partial")
    with file_lock(dest.with_name(dest.name + ".lock")):
        if not force and is_made(manifest, quant):  # another process made it meanwhile
            return dest
        try:
            _quantize(source, partial, quant, progress)
            sha = sha256_file(partial)
            _record(dest).unlink(missing_ok=True)
            marker_path(dest).unlink(missing_ok=True)
            os.replace(partial, dest)
            write_marker(dest, sha)
            _record(dest).write_text(_record_text(manifest, quant, sha), encoding="utf-8")
        except OSError as exc:
            raise PullError(f"{model}: {exc}") from exc
        finally:
            partial.unlink(missing_ok=True)
    return dest


def _record_text(manifest: Manifest, quant: str, sha: str) -> str:
    from hybridllm.local.fingerprint import llama_build

    record = {
        "base": manifest.name,
        "base_sha256": manifest.sha256,
        "quant": quant,
        "sha256": sha,
        "made_by": f"llama-cpp-python {llama_build()}",
    }
    return json.dumps(record, indent=2) + "\n"


def _quantize(source: Path, dest: Path, quant: str, progress: Progress | None) -> None:
    import ctypes

    from hybridllm.local.settings import cpu_threads

    llama_cpp = loader.llama_cpp()

    size = source.stat().st_size
    if progress is not None:
        progress("quantize", 0, size)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTS[quant])
    params.allow_requantize = True  # the shipped models are already quantized
    params.nthread = cpu_threads()
    with _quiet_llama():
        rc = llama_cpp.llama_model_quantize(
            str(source).encode(), str(dest).encode(), ctypes.byref(params)
        )
    if rc != 0 or not dest.is_file():
        raise PullError(f"llama.cpp could not requantize {source.name} to {quant} (code {rc})")
    if progress is not None:
        progress("quantize", size, size)


@contextlib.contextmanager
def _quiet_llama() -> Iterator[None]:
    """Silence llama.cpp's per-tensor log lines while quantizing."""
    _logger = loader.llama_cpp_part("_logger")
    before = _logger.logger.level
    _logger.logger.setLevel("ERROR")
    try:
        yield
    finally:
        _logger.logger.setLevel(before)
