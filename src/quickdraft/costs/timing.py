"""Measured forward costs (PEARL's window and the drafters' own step cost come from here)."""

from __future__ import annotations

import time

from quickdraft.runtime.target import Target


def step_seconds(model: Target, context: int = 64, repeats: int = 5) -> float:
    """Median seconds of one single-token cached step after `context` tokens (fewer when the model's
    context is short; the cache is reset)."""
    context = max(1, min(context, model.max_length - 1))
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
