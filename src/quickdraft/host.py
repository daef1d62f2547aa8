"""The host: its CPU (model name, flags) read once, the cache folder, measurements kept there, and the
median timer of what is measured on it.

On the ground floor (it imports nothing of quickdraft's), so the runtime's kernel choices
(`linear.packing`, the fused kernels' level and build key), the cost models above it and the weights'
conversions below it share one reader of /proc/cpuinfo, one cache folder and one timer.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """The quickdraft cache folder: `QUICKDRAFT_CACHE`, else ~/.cache/quickdraft."""
    return Path(os.environ.get("QUICKDRAFT_CACHE", Path.home() / ".cache" / "quickdraft"))


@functools.cache
def cpu_fields() -> dict[str, str]:
    """The first CPU's /proc/cpuinfo fields (model name, flags, ...), read once; {} where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512-BF16 or AMX): there bf16 autocast pays."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_fields().get("flags", "").split()))


def cpu_model() -> str:
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


def median_seconds(fn: Callable[[], object], repeats: int = 30, warmup: int = 5) -> float:
    """Median wall seconds of `fn()` over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def folder_in_place(target: Path):
    """Yield a fresh folder beside `target` to fill; on success it replaces `target` whole (renamed into
    place), on failure it is removed: a folder at `target` is always a complete one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc's malloc_trim), where there is one:
    after a build that made and dropped large temporaries (a GGUF's dequantized tensors)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


def safe_name(raw: str) -> str:
    """`raw` as a file name: runs of anything but letters, digits, `_`, `.` and `-` become `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def kept(path: Path, measure: Callable[[], object], encode=lambda value: value, decode=lambda raw: raw):
    """A measurement kept in a json file: read back (`decode(raw)`, which raises ValueError, KeyError
    or TypeError on a value it rejects), else `measure()`d and written (not kept where the folder
    cannot be written: measured again next time)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return decode(json.loads(path.read_text()))
    value = measure()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # written whole, then renamed: a reader
        tmp.write_text(json.dumps(encode(value)) + "\n")  # never sees half a file
        os.replace(tmp, path)
    return value
