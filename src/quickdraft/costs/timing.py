"""Measured forward costs (PEARL's window and the drafters' own step cost come from here)."""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median

from quickdraft.runtime.target import Target

PAIRED_ROUNDS = 3  # alternating measurements of a ratio's two sides (`paired_ratio`)


def step_seconds(model: Target, context: int = 64, repeats: int = 5) -> float:
    """Median seconds of one single-token cached step after `context` tokens (fewer when the model's
    context is short; the cache is reset)."""
    context = max(1, min(context, model.max_length - 1))
    probe = [i % min(model.vocab_size, 32) for i in range(3, 3 + context)]  # ids every model has rows for
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


def paired_ratio(
    numerator: Callable[[], float], denominator: Callable[[], float], rounds: int = PAIRED_ROUNDS
) -> tuple[float, float]:
    """(the median over `rounds` of numerator() / denominator(), the median denominator()), the two
    measured side by side in alternating order (a b, b a, a b, ...).

    A shared host can change speed between two measurements (the 2-core guests of docs/benchmarks.md
    change minute to minute): measured one after the other, one draft's price came out far above the
    price of four other specs of the same draft on the same kernel build, and the cache folder kept it
    (docs/benchmarks.md, stop 76). Side by side, a change of speed moves at most the one pair it falls
    in, which the median leaves out."""
    ratios, bottoms = [], []
    for i in range(rounds):
        if i % 2:
            bottom = denominator()
            top = numerator()
        else:
            top = numerator()
            bottom = denominator()
        ratios.append(top / bottom)
        bottoms.append(bottom)
    return median(ratios), median(bottoms)
