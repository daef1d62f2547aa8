"""The native block's fused CPU kernels (`fused.cpp`): built once per host, loaded once per process.

`fused_ops()` returns the compiled module, or None where it cannot be had (no C++ compiler, a failed
build, `QUICKDRAFT_FAST_BLOCK=0`); callers then run the torch ops they replace. The build uses
torch's own `cpp_extension` against the installed torch (no second torch is pulled), with
`-O3 -march=native`, into a folder of the quickdraft cache keyed by the source, the torch version
and this CPU's flags: a host with other features (AVX2 only, AVX-512, VNNI) builds its own copy.
`quickdraft prepare` builds it; otherwise the first process that needs it does (about a minute), and
every later process loads the built library directly.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import torch

from quickdraft.costs.host import cpu_fields
from quickdraft.weights.default import cache_dir

SOURCE = Path(__file__).with_name("fused.cpp")
NAME = "quickdraft_fused"
# -march=native: this host's vector units; reassociation lets dot products and sums vectorize (infinities
# and NaNs keep their meaning: no -ffast-math)
FLAGS = ["-O3", "-march=native", "-fopenmp"]
FLAGS += ["-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]


def _host_flags() -> str:
    return " ".join(sorted(cpu_fields().get("flags", "").split()))


def build_dir() -> Path:
    """Where this host's build lives: keyed by the source, torch's version and the CPU's flags."""
    parts = [SOURCE.read_bytes(), torch.__version__.encode(), _host_flags().encode(), " ".join(FLAGS).encode()]
    key = hashlib.sha1(b"\0".join(parts)).hexdigest()[:16]
    return cache_dir() / "kernels" / key


def _built(folder: Path):
    """The built module in `folder`, imported directly (no compiler run), or None."""
    for lib in folder.glob(f"{NAME}*.so"):
        spec = importlib.util.spec_from_file_location(NAME, lib)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return None


@functools.cache
def fused_ops():
    """The fused kernels module (built here once if needed), or None with the reason printed once."""
    if os.environ.get("QUICKDRAFT_FAST_BLOCK") == "0":
        return None
    folder = build_dir()
    try:
        module = _built(folder)
        if module is not None:
            return module
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        print("quickdraft: building the fused CPU kernels for this host once (about a minute) ...", file=sys.stderr)
        return load(
            name=NAME,
            sources=[str(SOURCE)],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch ops run instead
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        print(f"quickdraft: fused CPU kernels unavailable ({reason}); using torch ops", file=sys.stderr)
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
