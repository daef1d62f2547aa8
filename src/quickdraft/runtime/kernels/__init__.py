"""The native block's fused CPU kernels (`fused.cpp`): built once per host and instruction-set level,
loaded once per process.

`fused_ops()` returns the compiled module, or None where it cannot be had (no C++ compiler, a failed
build, `QUICKDRAFT_FAST_BLOCK=0`); callers then run the torch ops they replace.

**Levels, chosen at run time.** The kernels' vector paths are compiled in by the instruction sets
the build targets (`__AVX512F__`, `__AVX512VNNI__`, `__AVX512BF16__`; the linears' 256-bit paths by
`__AVX2__` where those are not; the rest is the compiler's vectorization). Each level is a named set of flags:
- `avx512_bf16`;
- `avx512_vnni`;
- `avx512` (x86-64-v4);
- `avx2` (x86-64-v3);
- `scalar` (x86-64).
The level is the best one that the CPU this process runs on reports in /proc/cpuinfo, read at run
time, not the build host's `-march=native`. `QUICKDRAFT_KERNEL_LEVEL=<level>` forces one (a level
this CPU lacks is refused by name), so each path can be run and tested on a host that has it.

The build uses torch's own `cpp_extension` against the installed torch (no second torch is pulled),
with `-O3 -mtune=native` and the level's flags. It goes into a folder of the quickdraft cache keyed
by:
- the sources, the torch version, the level's flags and this CPU's flags;
- the compiler's version and the Python extension ABI.
So a folder is never loaded by a process it was not built for. `quickdraft prepare` builds the
host's level; otherwise the first process that needs it does (about 30 s on 2 cores), and every
later process loads the built library directly. A failed build prints the compiler's own error line.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir, cpu_fields

SOURCE = Path(__file__).with_name("fused.cpp")  # the translation unit; it includes the parts (*.h) beside it
NAME = "quickdraft_fused"
# reassociation lets dot products and sums vectorize (infinities and NaNs keep their meaning: no -ffast-math)
MATH = ["-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"})  # x86-64-v3's /proc/cpuinfo names
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
# level -> (its compiler flags, the CPU flags it needs), best first
LEVELS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "avx512_bf16": (("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"), _V4 | {"avx512_vnni", "avx512_bf16"}),
    "avx512_vnni": (("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}),
    "avx512": (("-march=x86-64-v4",), _V4),
    "avx2": (("-march=x86-64-v3",), _V3),
    "scalar": (("-march=x86-64",), frozenset()),
}
NATIVE = "native"  # not x86-64 (an Arm host): the compiler's -march=native, the one level there


def _host_flags() -> set[str]:
    return set(cpu_fields().get("flags", "").split())


def supported_levels(flags: set[str] | None = None) -> list[str]:
    """The levels a CPU with `flags` (default: this one's) runs, best first."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [NATIVE]
    flags = _host_flags() if flags is None else flags
    return [name for name, (_, needs) in LEVELS.items() if needs <= flags]


def chosen_level() -> str:
    """The level this process runs: `QUICKDRAFT_KERNEL_LEVEL` when set (refused by name when unknown
    or beyond this CPU), else the best this CPU supports."""
    supported = supported_levels()
    forced = os.environ.get("QUICKDRAFT_KERNEL_LEVEL")
    if not forced:
        return supported[0]
    if forced not in (*LEVELS, NATIVE):
        raise QuickdraftError(f"QUICKDRAFT_KERNEL_LEVEL={forced!r}: no such level; choose one of {', '.join(LEVELS)}")
    if forced not in supported:
        raise QuickdraftError(f"QUICKDRAFT_KERNEL_LEVEL={forced}: this CPU lacks it; it runs {', '.join(supported)}")
    return forced


def flags(level: str) -> list[str]:
    """The compiler flags of a level's build."""
    arch = ["-march=native"] if level == NATIVE else [*LEVELS[level][0], "-mtune=native"]
    return ["-O3", *arch, "-fopenmp", *MATH]


@functools.cache
def _compiler() -> str:
    """The C++ compiler's first version line ("" when there is none)."""
    for cxx in (os.environ.get("CXX"), "c++", "g++"):
        if cxx:
            try:
                out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            return out.splitlines()[0] if out else ""
    return ""


def build_dir(level: str | None = None) -> Path:
    """Where a level's build lives (default: the chosen level): keyed by the sources, torch's version,
    the level's flags, this CPU's flags, the compiler and the Python extension ABI."""
    level = level or chosen_level()
    parts = [
        *(f.read_bytes() for f in sorted(SOURCE.parent.glob("*.[ch]*")) if f.suffix in (".cpp", ".h")),
        torch.__version__.encode(),
        " ".join(sorted(_host_flags())).encode(),
        " ".join(flags(level)).encode(),
        _compiler().encode(),
        str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
    ]
    key = hashlib.sha1(b"\0".join(parts)).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{level}-{key}"


def _built(folder: Path, name: str):
    """The built module in `folder`, imported directly (no compiler run), or None."""
    for lib in folder.glob(f"{name}*.so"):
        spec = importlib.util.spec_from_file_location(name, lib)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return None


def compiler_error(text: str) -> str:
    """The line of a failed build's output that says what failed (the compiler's own "error:" line),
    else its last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for mark in (": error:", "error:"):  # gcc/clang: "fused.cpp:12:3: error: ...", then a linker's
        found = next((line for line in lines if mark in line), None)
        if found is not None:
            return found
    return lines[-1] if lines else "the build failed"


def fused_ops(level: str | None = None):
    """The fused kernels module of `level` (default: the chosen level, `chosen_level`, found once per
    process), built here once if needed, or None with the reason printed once."""
    return _chosen() if level is None else _load(level)


@functools.cache
def _chosen():
    if os.environ.get("QUICKDRAFT_FAST_BLOCK") == "0":
        return None
    return _load(chosen_level())


@functools.cache
def _load(level: str):
    name = f"{NAME}_{level}"
    folder = build_dir(level)
    try:
        module = _built(folder, name)
        if module is not None:
            return module
        from torch.utils.cpp_extension import load

        partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")  # built aside, then renamed:
        partial.mkdir(parents=True, exist_ok=True)  # a build cut short is never found and loaded
        print(
            f"quickdraft: building the fused CPU kernels ({level}) for this host once (about 30 s) ...", file=sys.stderr
        )
        module = load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=flags(level),
            extra_ldflags=["-fopenmp"],
            build_directory=str(partial),
            verbose=False,
        )
        try:
            os.replace(partial, folder)
        except OSError:  # another process finished first: keep its folder
            shutil.rmtree(partial, ignore_errors=True)
        return module
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch ops run instead
        reason = compiler_error(str(exc)) if str(exc).strip() else type(exc).__name__
        print(f"quickdraft: fused CPU kernels ({level}) unavailable ({reason}); using torch ops", file=sys.stderr)
        return None


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels run on rows like `x`: CPU inference (no gradients) in bf16, float32 or
    float64, with the kernels available."""
    if x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float32, torch.float64):
        return False
    if torch.is_grad_enabled() and x.requires_grad:
        return False
    return fused_ops() is not None


def on_rows(fn, x: torch.Tensor, out: int, *args) -> torch.Tensor:
    """A kernel taking (n, in) rows (`fn(rows, *args, out)`) over x (..., in) -> (..., out)."""
    if x.dim() == 2:
        return fn(x, *args, out)
    return fn(x.reshape(-1, x.shape[-1]), *args, out).view(*x.shape[:-1], out)
