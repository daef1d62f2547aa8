"""The CMake arguments that build llama.cpp for this CPU, the peer's library (llama-cpp-python, README's
test command) and its own draft-model speculation binary (`bench/peers/llama_spec_peer.py`) alike.

llama.cpp's default `-march=native` build turns on every instruction set the compiler sees, AMX
included, and on an Intel Xeon virtual machine with AMX its first decode died on an AMX `tilezero`
(SIGILL, issue #47). This build names what it uses instead: `GGML_NATIVE=OFF`, then AVX, AVX2, FMA,
F16C, BMI2, AVX-VNNI and the AVX-512 sets this CPU reports in /proc/cpuinfo, with AMX off. On a host
without AMX that is the same code as the native build; elsewhere it is what runs.

Standard library only: `scripts/llama_cpp_cmake_args.py` loads this file by its path before anything
is installed.
"""

from __future__ import annotations

from pathlib import Path

BASE = ("-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF")
# ggml's option -> the /proc/cpuinfo flags it needs (all of them)
OPTIONS = {
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),  # ggml's -mavx512* set
    "GGML_AVX512_VBMI": ("avx512f", "avx512vbmi"),
    "GGML_AVX512_VNNI": ("avx512f", "avx512_vnni"),
    "GGML_AVX512_BF16": ("avx512f", "avx512_bf16"),
}
OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")  # AMX: never (issue #47)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first processor in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args(flags: set[str]) -> list[str]:
    """The CMake arguments for a CPU with `flags`."""
    args = list(BASE)
    for option, needs in OPTIONS.items():
        args.append(f"-D{option}={'ON' if all(f in flags for f in needs) else 'OFF'}")
    return args + [f"-D{option}=OFF" for option in OFF]


def host_flags() -> set[str]:
    """This host's CPU flags (empty where /proc/cpuinfo does not exist)."""
    info = Path("/proc/cpuinfo")
    return cpu_flags(info.read_text()) if info.exists() else set()
