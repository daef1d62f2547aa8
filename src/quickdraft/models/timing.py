"""Measured forward costs (PEARL's window and the drafters' own step cost come from here)."""

from __future__ import annotations

import functools
import platform
import time
from pathlib import Path

from quickdraft.models.target import Target


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


def step_seconds(model: Target, context: int = 64, repeats: int = 5) -> float:
    """Median seconds of one single-token cached step after `context` tokens (the cache is reset)."""
    probe = [i % model.vocab_size for i in range(3, 3 + context)]
    model.reset()
    model.extend(probe)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.extend(probe[-1:], last_only=True)
        times.append(time.perf_counter() - start)
        model.rollback(context)
    model.reset()
    return sorted(times)[len(times) // 2]
