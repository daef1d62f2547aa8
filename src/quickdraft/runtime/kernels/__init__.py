"""The native block's fused CPU kernels (`fused.cpp`): built once per host and instruction-set level,
loaded once per process.

`fused_ops()` returns the compiled module, or None where it cannot be had (no C++ compiler, a failed
build, `QUICKDRAFT_FAST_BLOCK=0`); callers then run the torch ops they replace.

**Levels, chosen at run time** (`levels.py`: x86-64's avx512_bf16 down to scalar, with avx_vnni; Arm's
i8mm, dotprod and scalar). The kernels' vector paths are compiled in by the instruction sets the build
targets (`__AVX512F__`, `__AVX512VNNI__`, `__AVX512BF16__`; the linears' 256-bit paths by `__AVX2__` where
those are not, with `__AVXVNNI__`'s dot product where the level has it; `__ARM_FEATURE_DOTPROD` and
`__ARM_FEATURE_MATMUL_INT8` on Arm; the rest is the compiler's vectorization). The level is the best one
the CPU this process runs on reports (`host.cpu_features`: /proc/cpuinfo's flags or Features, macOS's
sysctl), read at run time, not the build host's `-march=native`; `QUICKDRAFT_KERNEL_LEVEL` forces one.

The build uses torch's own `cpp_extension` against the installed torch (no second torch is pulled),
with `-O3 -mtune=native` and the level's flags. It goes into a folder of the quickdraft cache keyed
by:
- the sources, the torch version, the level's flags and this CPU's features (on every OS);
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
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from quickdraft.host import cache_dir, cpu_features
from quickdraft.runtime.kernels import levels

SOURCE = Path(__file__).with_name("fused.cpp")  # the translation unit; it includes the parts (*.h) beside it
NAME = "quickdraft_fused"
LEVELS = levels.levels()  # this architecture's levels, best first
NATIVE = levels.NATIVE


def supported_levels(features: set[str] | frozenset[str] | None = None) -> list[str]:
    """The levels a CPU of this architecture with `features` (default: this one's) runs, best first."""
    return levels.supported_levels(features)


def chosen_level() -> str:
    """The level this process runs (`levels.chosen_level`)."""
    return levels.chosen_level()


def flags(level: str) -> list[str]:
    """The compiler flags of a level's build with this host's compiler."""
    return levels.flags(level, _compiler())


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
        " ".join(sorted(cpu_features())).encode(),
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
            extra_ldflags=levels.openmp(_compiler())[1],
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
