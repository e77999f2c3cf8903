"""Which llama.cpp instruction sets to build for the CPU that is there, flag by flag.

`./dev` runs this file with the system's Python before any virtual environment exists, so it
imports nothing but the standard library:

    python3 hybridllm/local/cpubuild.py            # the CMake arguments for this machine
    python3 hybridllm/local/cpubuild.py --key 0.3.36 [ARGS...]  # the wheelhouse key
    python3 hybridllm/local/cpubuild.py --check    # compare the installed build with the CPU

Why not `GGML_NATIVE`: on a VM whose CPU reports AMX that the hypervisor does not enable, the
native build dies with "Illegal instruction" (DESIGN.md). So every x86 option is named, ON where
the CPU reports its flag and OFF elsewhere; AMX stays OFF. On ARM the native build is used.

Why flag by flag: the old rule used AVX-512 only with all of avx512f, avx512_vnni, avx512_bf16
AND avx_vnni, so an AMD Zen 4 (AVX-512 with VNNI and BF16, but no AVX-VNNI) got the AVX2 set:
prefill of Qwen2.5-Coder-0.5B 163 tokens/s against 244 with the AVX-512 set (issue 16).
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Iterable

# (GGML option, the /proc/cpuinfo flags it needs, the GGML options it needs)
OPTIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",), ()),
    ("GGML_AVX", ("avx",), ()),
    ("GGML_F16C", ("f16c",), ("GGML_AVX",)),
    ("GGML_FMA", ("fma",), ("GGML_AVX",)),
    ("GGML_BMI2", ("bmi2",), ()),
    ("GGML_AVX2", ("avx2",), ("GGML_AVX",)),
    ("GGML_AVX_VNNI", ("avx_vnni",), ("GGML_AVX2",)),
    # ggml's AVX512 option compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), ("GGML_AVX2",)),
    ("GGML_AVX512_VBMI", ("avx512vbmi",), ("GGML_AVX512",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",), ("GGML_AVX512",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",), ("GGML_AVX512",)),
)
ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
COMMON = ("-DLLAVA_BUILD=OFF",)
X86 = ("x86_64", "amd64", "i686", "i386")

# llama.cpp's system info names (llama_print_system_info) for the options above
FEATURE_OF = {
    "GGML_SSE42": "SSE3",  # the info line reports SSE3/SSSE3, not SSE4.2
    "GGML_AVX": "AVX",
    "GGML_F16C": "F16C",
    "GGML_FMA": "FMA",
    "GGML_BMI2": "BMI2",
    "GGML_AVX2": "AVX2",
    "GGML_AVX_VNNI": "AVX_VNNI",
    "GGML_AVX512": "AVX512",
    "GGML_AVX512_VBMI": "AVX512_VBMI",
    "GGML_AVX512_VNNI": "AVX512_VNNI",
    "GGML_AVX512_BF16": "AVX512_BF16",
}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def enabled(flags: Iterable[str]) -> list[str]:
    """The GGML options this CPU supports, in build order."""
    have, on = set(flags), []
    for option, needs, requires in OPTIONS:
        if all(f in have for f in needs) and all(r in on for r in requires):
            on.append(option)
    return on


def cmake_args(flags: Iterable[str], machine: str) -> list[str]:
    """CMake arguments for llama-cpp-python on a CPU with `flags` and `machine` (uname -m)."""
    if machine.lower() not in X86:
        return ["-DGGML_NATIVE=ON", *COMMON]
    on = set(enabled(flags))
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if option in on else 'OFF'}" for option, _, _ in OPTIONS]
    args += [f"-D{option}=OFF" for option in ALWAYS_OFF]
    return [*args, *COMMON]


def build_key(version: str, args: Iterable[str]) -> str:
    """A short key for a built wheel: the same version and arguments give the same key."""
    text = version + " " + " ".join(sorted(args))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def built_features(system_info: str) -> set[str]:
    """The features a llama.cpp build reports (`llama_print_system_info`: "AVX = 1 | ...")."""
    found = set()
    for part in system_info.replace("\n", "|").split("|"):
        name, _, value = part.partition("=")
        if value.strip() == "1":
            found.add(name.rpartition(":")[2].strip())  # "CPU : SSE3 = 1" names SSE3
    return found


def missing(flags: Iterable[str], system_info: str) -> list[str]:
    """Features the CPU offers that the build lacks (named as llama.cpp names them)."""
    built = built_features(system_info)
    return [FEATURE_OF[o] for o in enabled(flags) if FEATURE_OF[o] not in built]


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    flags, machine = cpu_flags(_read_cpuinfo()), platform.machine()
    if argv[:1] == ["--check"]:
        from hybridllm.local import loader  # only `--check` runs inside the project's environment

        info = loader.llama_cpp().llama_print_system_info().decode("utf-8", "replace")
        lacking = missing(flags, info) if machine.lower() in X86 else []
        if lacking:
            print(f"the llama.cpp build lacks {', '.join(lacking)}, which this CPU offers")
            return 1
        return 0
    if argv[:1] == ["--key"]:  # --key VERSION [CMAKE ARGS...]: the wheelhouse key
        print(build_key(argv[1], argv[2:] or cmake_args(flags, machine)))
        return 0
    print(" ".join(cmake_args(flags, machine)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
