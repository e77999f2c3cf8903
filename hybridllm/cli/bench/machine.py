"""What a benchmark ran on: every figure and the JSON name it (the numbers mean little
without the CPU, the models, their quantization, the llama.cpp build and the date)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hybridllm.errors import HybridError
from hybridllm.local import cpubuild, models, variants

_QUANT_IN_NAME = re.compile(r"(i?q\d+_[0-9a-z_]+|f16|bf16|f32)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model as benchmarked: its name, quantization (None: not known, e.g. a cloud's) and
    where it ran ("llama.cpp in-process", "stand-in cloud on 127.0.0.1", an endpoint URL)."""

    name: str
    quantization: str | None
    where: str

    def label(self) -> str:
        quant = f" {self.quantization}" if self.quantization else ""
        return f"{self.name}{quant} ({self.where})"


@dataclass(frozen=True, slots=True)
class MachineInfo:
    cpu: str
    cores: int
    machine: str
    llama_cpp: str  # the llama-cpp-python version and the instruction sets its build has
    local: ModelInfo
    cloud: ModelInfo
    date: str  # ISO 8601, UTC

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def caption(self) -> str:
        """One line for the foot of a figure."""
        return (
            f"{self.cpu}, {self.cores} cores ({self.machine}); llama-cpp-python {self.llama_cpp}; "
            f"local {self.local.label()}; cloud {self.cloud.label()}; {self.date}"
        )


def cpu_model(cpuinfo: str) -> str:
    """The first "model name" of a /proc/cpuinfo text (the platform's word elsewhere)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def quantization(model: str) -> str | None:
    """A local model's quantization: "name:quant", its manifest's, or its file name's."""
    base, quant = variants.split(model)
    if quant is not None:
        return quant
    try:
        return models.get_manifest(base).quantization
    except HybridError:
        match = _QUANT_IN_NAME.search(Path(model).name)
        return match.group(1).upper() if match else None


def llama_build() -> str:
    """ "0.3.36 [AVX, AVX2, ...]": the version and the built instruction sets."""
    from hybridllm.local import loader

    llama = loader.llama_cpp()
    info = llama.llama_print_system_info().decode("utf-8", "replace")
    built = [f for f in cpubuild.FEATURE_OF.values() if f in cpubuild.built_features(info)]
    return f"{getattr(llama, '__version__', '?')} [{', '.join(built) or 'no named sets'}]"


def describe(local: ModelInfo, cloud: ModelInfo) -> MachineInfo:
    """This machine, now."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        cpuinfo = ""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return MachineInfo(
        cpu_model(cpuinfo),
        os.cpu_count() or 1,
        platform.machine(),
        llama_build(),
        local,
        cloud,
        now,
    )
