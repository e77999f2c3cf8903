"""Fingerprints of what a speed measurement depends on: the model file, the llama.cpp build and
the CPU. `hybridllm.local.tune` stores them with a tuning and compares them on load."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
from pathlib import Path


def file_stamp(path: Path) -> str:
    st = path.stat()
    return f"size={st.st_size} mtime_ns={st.st_mtime_ns}"


def sha256_file(path: Path | str) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def llama_build() -> str:
    """llama-cpp-python's version and the sizes of its native libraries (a rebuild with other
    flags changes them)."""
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "missing"
    lib = os.environ.get("LLAMA_CPP_LIB_PATH")
    if lib is None:
        spec = importlib.util.find_spec("llama_cpp")
        origin = spec.origin if spec is not None else None
        lib = str(Path(origin).parent / "lib") if origin else ""
    digest = hashlib.sha256()
    for so in sorted(Path(lib).glob("lib*.so")) if lib else []:
        digest.update(f"{so.name}:{so.stat().st_size};".encode())
    return f"{version}/{digest.hexdigest()[:16]}"


def cpu_flags() -> list[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); else the processor name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return sorted(set(line.partition(":")[2].split()))
    except OSError:
        pass
    return [platform.machine(), platform.processor()]


def cpu_fingerprint() -> str:
    # imported here: `hybridllm.local.waitpolicy` reads this while `hybridllm` itself is importing
    from hybridllm.local.settings import cpu_threads

    text = " ".join(cpu_flags()) + f" threads={cpu_threads()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
