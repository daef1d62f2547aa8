"""The host's batched verify-cost surface, and what it implies: the draft budget per batch size and
the default batch size.

A round over B rows with a draft budget k is one batched forward of B x (k + 1) new rows. On a
host whose wide forwards are nearly free (AVX-512-BF16: 8 rows cost about 1.1 single-row steps)
speculation pays at small batches; as B grows the forward becomes compute-bound and every draft
node costs what it is worth, so the budget shrinks and then drops to 0 (vLLM switches speculation
off past a batch size set by hand, `disable_by_batch_size`; here the switch point is read off the
measured surface). The surface is measured once per host for the embedded default (cache folder).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from quickdraft.costs.cost_curve import _persisted, host_key, relative_cost

BATCHES = (1, 2, 4, 8, 16, 32, 64)
WIDTHS = (1, 2, 5, 9, 17)  # budget + 1 for the budgets of the gain tables (1, 4, 8, 16)
WIDE = 32  # from this batch on, widths up to 5 only (a wide block at a wide batch is compute-bound: no budget pays)
GROWTH = 1.1  # a batch size is measured while the one before it made plain rows this much faster
Surface = dict[tuple[int, int], float]
Drafting = Callable[[int], float]  # draft nodes -> a row's drafting of them, in one-row steps


def measure_batch_costs(target, batches=BATCHES, widths=WIDTHS, context: int = 200, repeats: int = 3) -> Surface:
    """{(rows, width): the least seconds of a batched forward's timed passes / that of (1, 1)} (a busy
    host's interference only adds time: a median of three had priced 16 plain rows above 16 rows of 2,
    and stopped the sizes there), every row after `context` cached tokens; batch sizes from the smallest
    up, a size past 16 only while the size before it still made plain rows GROWTH times faster. target:
    a `runtime/caches/batched.BatchedTarget` with no running rows and max_batch >= max(batches); it has
    none running afterwards either."""
    if target.rows:
        raise ValueError("measure_batch_costs: the batch is running")
    from quickdraft.runtime.caches.batched import RowBlock
    from quickdraft.runtime.kernels.attention import invariant_prefill

    context = max(1, min(context, target.max_length - max(widths)))  # a short-context model: fewer
    probe = [3 + i % max(1, target.vocab_size - 3) for i in range(context)]
    with invariant_prefill():  # the prefill cache keeps the probe: held rows as a request's prefill makes them
        target.prefill(probe, first=True)
    for _ in range(max(batches)):
        target.adopt()
    lengths = list(target.cache.lengths)
    times: dict[tuple[int, int], list[float]] = {}
    for i, b in enumerate(batches):
        ws = [w for w in widths if b < WIDE or w <= 5]
        for _ in range(repeats + 1):
            for w in ws:
                target.cache.lengths = lengths[:b]  # the first b rows run; nothing is committed
                start = time.perf_counter()
                target.forward([RowBlock(probe[:w]) for _ in range(b)])
                times.setdefault((b, w), []).append(time.perf_counter() - start)
        if b >= 16 and i and plain_rate(times, b) < GROWTH * plain_rate(times, batches[i - 1]):
            break
    target.cache.lengths = lengths
    while target.rows:
        target.remove(target.rows - 1)
    base = min(times[(batches[0], widths[0])][1:])  # the first pass warms up
    return {key: min(t[1:]) / base for key, t in times.items()}


def plain_rate(times: dict[tuple[int, int], list[float]], b: int) -> float:
    """Rows a second of b plain rows (width 1), from their timed forwards (the first a warm-up)."""
    return b / min(times[(b, 1)][1:])


def batch_cost_surface(make_target, model_name: str, dtype: str, persist: bool, weights: str = "none") -> Surface:
    """The measured surface for this target on this host (memoised; in the cache folder when
    `persist`); `make_target()` builds the BatchedTarget to measure on, only when it is measured."""
    return _persisted(
        host_key(model_name, dtype, weights) + "-batch",
        persist,
        lambda: measure_batch_costs(make_target()),
        lambda s: {f"{b},{w}": round(v, 4) for (b, w), v in s.items()},
        lambda raw: {tuple(int(x) for x in k.split(",")): float(v) for k, v in raw.items()},
    )


def covering_size(sizes, rows: int) -> int:
    """The smallest of the measured batch `sizes` that holds `rows` rows, else the largest."""
    ordered = sorted(sizes)
    return next((b for b in ordered if b >= rows), ordered[-1])


def surface_cost(surface: Surface, rows: int, width: int) -> float:
    """The surface at (rows, width): at the measured batch size covering `rows` (`covering_size`),
    linear in width between measured widths (beyond the last: its last slope continued)."""
    b = covering_size({b for b, _ in surface}, rows)
    return relative_cost({w: v for (bb, w), v in surface.items() if bb == b}, width)


def plan_budgets(
    surface: Surface, gain: dict[int, float] | None, fixed: int | None = None, drafting: Drafting | None = None
) -> dict[int, int]:
    """{batch size: draft budget per row} for each measured batch size: `fixed` when given, else the
    budget (a key of `gain`, or 0) maximising gain[k] / (cost(B, k + 1) + B drafting(k)); 0 where no
    budget beats plain decoding, or without a gain table. `drafting(k)`: a row's drafting of k nodes, in
    one-row steps (a suffix drafter's lookups; unpriced, a budget of 1 had beaten plain rows at 32 rows
    by its forward alone and lost by its lookups)."""
    plan = {}
    for b in sorted({b for b, _ in surface}):
        if fixed is not None or not gain:
            plan[b] = fixed or 0
            continue
        best, rate = 0, 1.0 / surface_cost(surface, b, 1)
        for k, tokens in sorted(gain.items()):
            r = tokens / round_cost(surface, b, k, drafting)
            if r > rate * 1.0001:
                best, rate = k, r
        plan[b] = best
    return plan


def round_cost(surface: Surface, b: int, k: int, drafting: Drafting | None) -> float:
    """A round of b rows with k draft nodes each, in one-row steps: the forward, and every row's drafting."""
    return surface_cost(surface, b, k + 1) + (b * drafting(k) if drafting is not None and k else 0.0)


def fit_max_batch(
    surface: Surface,
    plan: dict[int, int],
    gain: dict[int, float] | None,
    growth: float = GROWTH,
    drafting: Drafting | None = None,
) -> int:
    """The default batch size: the largest measured B (from the smallest up) while the aggregate
    token rate (both at their planned budgets) still grows by `growth` per measured size. Under a
    load of more requests than rows the others wait, so the batch that makes the most tokens per
    second also gives the lowest latency; a size that adds little throughput adds only memory. Each size
    is priced at the better of its planned drafting (where `gain` measures what a budget commits) and a
    plain batch (one token a row at width 1: the guard drops to it where drafting loses); a budget with
    no measured gain (a draft model's chains) is not priced as committing one token for its k + 1 rows
    (that pricing had fitted the Qwen pair's batch to 1 on an AVX2 host where 4 clients measured more
    than one: docs/benchmarks.md)."""

    def rate(b: int) -> float:
        plain = b / surface_cost(surface, b, 1)
        k = plan[b]
        if not (gain and k in gain):
            return plain
        return max(plain, b * gain[k] / round_cost(surface, b, k, drafting))

    sizes = sorted(plan)
    chosen = sizes[0]
    for b in sizes[1:]:
        if rate(b) < growth * rate(chosen):
            break
        chosen = b
    return chosen
