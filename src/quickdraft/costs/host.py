"""The host: its CPU (model name, flags) read once, and the median timer of what is measured on it.

At the bottom of the models package (it imports nothing of quickdraft's), so the runtime's kernel
choices (`linear.packing`, the fused kernels' build key) and the cost measurements share one reader of
/proc/cpuinfo and one timer.
"""

from __future__ import annotations

import functools
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


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
