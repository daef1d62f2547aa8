"""The fused kernels' instruction-set levels: which the CPU runs, which one this process runs, and each
one's compiler flags. Torch-free, so `scripts/arm_check.sh` cross-builds with the flags the runtime uses.

A level is a named set of compiler flags and the CPU features it needs (Linux's names, read on every OS
by `host.cpu_features`), best first per architecture:
- x86-64: `avx512_bf16`, `avx512_vnni`, `avx512` (x86-64-v4), `avx_vnni` (x86-64-v3 with AVX-VNNI's
  256-bit `vpdpbusd`: Intel's client chips since Alder Lake; a CPU with AVX-512 too picks an AVX-512
  level unless this one is forced), `avx2` (x86-64-v3), `scalar` (x86-64);
- aarch64: `i8mm` (`smmla` for two rows at once, `sdot` otherwise), `dotprod` (`sdot`), `scalar` (Armv8-A:
  the portable C++, vectorized by the compiler);
- any other machine: `native` (`-march=native`), the one level there.
`QUICKDRAFT_KERNEL_LEVEL=<level>` forces one (a level this CPU lacks is refused by name), so each path can
be run and tested on a host that has it.

OpenMP: gcc and llvm clang take `-fopenmp`; Apple's clang does not, so there the build takes Homebrew's
libomp where it is installed (`-Xpreprocessor -fopenmp` and `-lomp`) and otherwise builds without it
(torch's `at::parallel_for` then runs the kernels' loops on one thread: correct, slower).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from quickdraft.errors import QuickdraftError
from quickdraft.host import cpu_features

_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"})  # x86-64-v3's /proc/cpuinfo names
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
Level = tuple[tuple[str, ...], frozenset[str]]  # (its compiler flags, the CPU features it needs)
X86: dict[str, Level] = {
    "avx512_bf16": (("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"), _V4 | {"avx512_vnni", "avx512_bf16"}),
    "avx512_vnni": (("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}),
    "avx512": (("-march=x86-64-v4",), _V4),
    "avx_vnni": (("-march=x86-64-v3", "-mavxvnni"), _V3 | {"avx_vnni"}),
    "avx2": (("-march=x86-64-v3",), _V3),
    "scalar": (("-march=x86-64",), frozenset()),
}
ARM: dict[str, Level] = {
    "i8mm": (("-march=armv8.2-a+dotprod+i8mm",), frozenset({"asimddp", "i8mm"})),
    "dotprod": (("-march=armv8.2-a+dotprod",), frozenset({"asimddp"})),
    "scalar": (("-march=armv8-a",), frozenset()),
}
NATIVE = "native"  # neither x86-64 nor aarch64: the compiler's -march=native, the one level there
# reassociation lets dot products and sums vectorize (infinities and NaNs keep their meaning: no -ffast-math)
MATH = ("-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros")
LIBOMP = Path("/opt/homebrew/opt/libomp")  # Homebrew's libomp on an Arm Mac (/usr/local/opt on an Intel one)


def arch(machine: str | None = None) -> str:
    """ "x86_64", "aarch64" or "other" for `machine` (default: this one's `platform.machine()`)."""
    name = (machine or platform.machine()).lower()
    return "x86_64" if name in ("x86_64", "amd64") else "aarch64" if name in ("aarch64", "arm64") else "other"


def levels(machine: str | None = None) -> dict[str, Level]:
    """The levels of an architecture, best first."""
    return {"x86_64": X86, "aarch64": ARM}.get(arch(machine), {NATIVE: ((), frozenset())})


def supported_levels(features: set[str] | frozenset[str] | None = None, machine: str | None = None) -> list[str]:
    """The levels a CPU with `features` (default: this one's) runs, best first."""
    features = cpu_features() if features is None else features
    return [name for name, (_, needs) in levels(machine).items() if needs <= features]


def chosen_level() -> str:
    """The level this process runs: `QUICKDRAFT_KERNEL_LEVEL` when set (refused by name when unknown
    or beyond this CPU), else the best this CPU supports."""
    supported = supported_levels()
    forced = os.environ.get("QUICKDRAFT_KERNEL_LEVEL")
    if not forced:
        return supported[0]
    if forced not in levels():
        raise QuickdraftError(f"QUICKDRAFT_KERNEL_LEVEL={forced!r}: no such level; choose one of {', '.join(levels())}")
    if forced not in supported:
        raise QuickdraftError(f"QUICKDRAFT_KERNEL_LEVEL={forced}: this CPU lacks it; it runs {', '.join(supported)}")
    return forced


def openmp(compiler: str, system: str | None = None, libomp: Path = LIBOMP) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for OpenMP with the compiler whose version line is `compiler`."""
    if "Apple clang" not in compiler and (system or platform.system()) != "Darwin":
        return ["-fopenmp"], ["-fopenmp"]
    if (libomp / "include" / "omp.h").exists():
        return ["-Xpreprocessor", "-fopenmp", f"-I{libomp / 'include'}"], [f"-L{libomp / 'lib'}", "-lomp"]
    return [], []


def flags(level: str, compiler: str = "", machine: str | None = None) -> list[str]:
    """The compiler flags of a level's build (with `compiler`'s OpenMP flags)."""
    if level == NATIVE:
        target = ["-march=native"]
    elif arch(machine) == "x86_64":
        target = [*X86[level][0], "-mtune=native"]
    else:
        target = list(ARM[level][0])
    return ["-O3", *target, *openmp(compiler)[0], *MATH]
