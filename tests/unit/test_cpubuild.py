"""The llama.cpp build flags, chosen flag by flag from recorded /proc/cpuinfo flag lines."""

from __future__ import annotations

import pytest

from hybridllm.local import cpubuild

# this machine (AMD EPYC, family 25 model 17: Zen 4), recorded as /proc/cpuinfo prints it
ZEN4 = (
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush m"
    "mx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good n"
    "opl xtopology nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 "
    "pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hype"
    "rvisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext vm"
    "mcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx s"
    "map avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1"
    " xsaves avx512_bf16 clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmu"
    "lqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm"
)
# Intel Sapphire Rapids in a VM that reports AMX (which the hypervisor may not enable)
SAPPHIRE_RAPIDS = (
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush"
    " mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology"
    " cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx"
    " f16c rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 hle avx2 smep bmi2 erms"
    " invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni"
    " avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat"
    " avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni"
    " avx512_bitalg avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize"
    " tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities"
)
# an AVX2 laptop (Intel Skylake client): no AVX-512, no VNNI
AVX2_LAPTOP = (
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush"
    " mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq"
    " ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm abm"
    " 3dnowprefetch bmi1 avx2 smep bmi2 erms invpcid mpx rdseed adx smap clflushopt xsaveopt"
)
# Intel Alder Lake: AVX-VNNI but no AVX-512
ALDER_LAKE = AVX2_LAPTOP + " avx_vnni gfni vaes vpclmulqdq movdiri movdir64b serialize"


def _on(cpuinfo: str) -> set[str]:
    args = cpubuild.cmake_args(cpubuild.cpu_flags(cpuinfo), "x86_64")
    assert "-DGGML_NATIVE=OFF" in args and "-DLLAVA_BUILD=OFF" in args
    return {a[2:-3] for a in args if a.endswith("=ON")}


def test_zen4_gets_avx512_without_avx_vnni() -> None:
    on = _on(ZEN4)
    assert {"GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI"} <= on
    assert "GGML_AVX_VNNI" not in on
    assert {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_SSE42"} <= on


def test_sapphire_rapids_gets_everything_but_amx() -> None:
    on = _on(SAPPHIRE_RAPIDS)
    assert {"GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"} <= on
    assert not any("AMX" in option for option in on)
    args = cpubuild.cmake_args(cpubuild.cpu_flags(SAPPHIRE_RAPIDS), "x86_64")
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)


def test_avx2_laptop_names_every_missing_set_off() -> None:
    on = _on(AVX2_LAPTOP)
    assert on == {"GGML_SSE42", "GGML_AVX", "GGML_F16C", "GGML_FMA", "GGML_BMI2", "GGML_AVX2"}
    args = cpubuild.cmake_args(cpubuild.cpu_flags(AVX2_LAPTOP), "x86_64")
    assert "-DGGML_AVX512=OFF" in args and "-DGGML_AVX_VNNI=OFF" in args


def test_alder_lake_gets_avx_vnni_without_avx512() -> None:
    on = _on(ALDER_LAKE)
    assert "GGML_AVX_VNNI" in on and not any("AVX512" in option for option in on)


def test_an_extension_without_its_base_is_not_enabled() -> None:
    # avx512_vnni reported without the AVX-512 foundation set (a masked VM): nothing AVX-512
    assert not any("AVX512" in o for o in _on(AVX2_LAPTOP + " avx512_vnni avx512f"))
    assert _on("flags : sse4_2") == {"GGML_SSE42"}  # no AVX at all: every AVX option is OFF


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_arm_leaves_it_to_the_native_build(machine: str) -> None:
    args = cpubuild.cmake_args({"fp", "asimd", "sve"}, machine)
    assert args == ["-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF"]


def test_the_build_key_follows_the_arguments() -> None:
    zen4 = cpubuild.cmake_args(cpubuild.cpu_flags(ZEN4), "x86_64")
    laptop = cpubuild.cmake_args(cpubuild.cpu_flags(AVX2_LAPTOP), "x86_64")
    assert cpubuild.build_key("0.3.36", zen4) == cpubuild.build_key("0.3.36", list(reversed(zen4)))
    assert cpubuild.build_key("0.3.36", zen4) != cpubuild.build_key("0.3.36", laptop)
    assert cpubuild.build_key("0.3.36", zen4) != cpubuild.build_key("0.3.37", zen4)


def test_a_build_that_lacks_what_the_cpu_offers_is_named() -> None:
    avx2_build = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 |"
    flags = cpubuild.cpu_flags(ZEN4)
    assert cpubuild.missing(flags, avx2_build) == [
        "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"
    ]  # fmt: skip
    full = avx2_build + " AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 |"
    assert cpubuild.missing(flags, full) == []
    assert cpubuild.missing(cpubuild.cpu_flags(AVX2_LAPTOP), avx2_build) == []
