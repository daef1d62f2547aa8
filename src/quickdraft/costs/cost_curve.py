"""The host's verify-cost curve and the tree budget it implies.

Verifying a tree of b nodes is one target forward over b + 1 rows, whose cost relative to one row
depends on the host (AVX-512-BF16 vs AVX2 kernels), the dtype and the threads, and is not flat or
even monotone (kernels switch by row count). `cost_curve` measures it once per process (interleaved
across widths, so drift hits every width alike) and, for the embedded default target, once per host
in the cache folder. `best_budget` picks the budget that maximises expected tokens per second:
expected tokens per forward (a drafter's measured gain table) over the forward's relative cost.
"""

from __future__ import annotations

import hashlib
import time

import torch

from quickdraft.host import cpu_model, kept, safe_name

WIDTHS = (1, 2, 3, 5, 9, 13, 17, 25, 33)  # rows: budget + 1 for the budgets of the gain tables
_MEMO: dict[str, object] = {}
PERSIST_DRAFTING = True  # tests turn it off: they pin what the cost model measures (tests/conftest.py)


def host_key(model_name: str, dtype: str, weights: str = "none") -> str:
    """What a measured curve depends on: CPU model and kernels, threads, torch, the runtime's kernels
    (the packed linear chosen here, the fused block kernels' build or none), dtype, model and its weights'
    form (a quantized target's curve is much steeper: its kernels are row-bound)."""
    from quickdraft.runtime import kernels
    from quickdraft.runtime.kernels.linear import packing

    capability = torch.backends.cpu.get_cpu_capability()
    # the fused kernels' build, its level and the hash of its sources, torch and CPU flags: a changed kernel is
    # measured anew (a cut to the level's first 8 letters kept one curve across kernel changes: stop 75)
    fused = f"fused{kernels.build_dir().name}" if kernels.fused_ops() is not None else "torch"
    runtime = f"{packing() or 'plain'}-{fused}"
    raw = f"{cpu_model()}-{capability}-t{torch.get_num_threads()}-torch{torch.__version__}-{runtime}"
    raw += f"-{dtype}-{model_name}"
    raw += "" if weights == "none" else f"-{weights}"
    return safe_name(raw)


def measure_cost_curve(model, widths=WIDTHS, context: int = 200, repeats: int = 5) -> dict[int, float]:
    """{rows: the fastest of `repeats` forwards over that many new rows / that of one row}, measured after
    `context` cached tokens (fewer when the model's context is short); the cache is reset afterwards.
    The fastest, not the median: on a shared host one slow pass of the one-row base moved every ratio
    (a 2-row forward at 0.78 one-row steps, kept in the cache folder for every later process).
    model: a cache owner (extend/rollback)."""
    context = max(1, min(context, model.max_length - max(widths)))
    probe = [3 + i % max(1, model.vocab_size - 3) for i in range(context)]
    model.reset()
    model.extend(probe)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats + 1):
        for w in widths:
            model.rollback(context)
            start = time.perf_counter()
            model.extend(probe[:w])
            times[w].append(time.perf_counter() - start)
    model.reset()
    base = min(times[widths[0]][1:])  # the first pass warms up
    return {w: min(times[w][1:]) / base for w in widths}


def _persisted(key: str, persist: bool, measure, encode, decode):
    """A measurement memoised per process under `key`, and in the cache folder when `persist`."""
    if key not in _MEMO:
        if persist:
            from quickdraft.host import cache_dir

            _MEMO[key] = kept(cache_dir() / "costs" / f"{key}.json", measure, encode, decode)
        else:
            _MEMO[key] = measure()
    return _MEMO[key]


def cost_curve(model, model_name: str, dtype: str, persist: bool, weights: str = "none") -> dict[int, float]:
    """The measured curve for this target on this host: memoised per process, and in the cache
    folder when `persist` (the embedded default and the named targets; others are measured once per process)."""
    return _persisted(
        host_key(model_name, dtype, weights),
        persist,
        lambda: measure_cost_curve(model),
        lambda curve: {str(k): round(v, 4) for k, v in curve.items()},
        lambda raw: {int(k): float(v) for k, v in raw.items()},
    )


def drafting_costs(
    model_name: str, dtype: str, persist: bool, weights: str, drafter_key: str, measure
) -> tuple[float | None, float]:
    """(a model drafter's step in target steps, None for a model-free drafter; its lookups a drafted
    round, in target steps) on this host: `measure()`d, and for the embedded default kept in the
    cache folder beside its curve. The auto tree budget, PEARL's window and the draft guard read
    them, so with them kept every process decides alike: a seeded sampled generation repeats on this
    host (measured anew in each process, their noise changed which rounds drafted, and so the text)."""
    if not (persist and PERSIST_DRAFTING):
        return measure()
    digest = hashlib.sha1(drafter_key.encode()).hexdigest()[:10]
    # "drafting2": measured side by side (`timing.paired_ratio`); a price measured the old way is not read
    key = f"{host_key(model_name, dtype, weights)}-drafting2-{safe_name(drafter_key)[:40]}-{digest}"
    return _persisted(
        key,
        True,
        measure,
        lambda costs: {"draft_step": costs[0], "lookup": costs[1]},
        lambda raw: (raw["draft_step"], float(raw["lookup"])),
    )


def relative_cost(curve: dict[int, float], rows: int) -> float:
    """The curve at `rows`, linear between measured widths (beyond the last: its last slope continued)."""
    widths = sorted(curve)
    if rows <= widths[0] or len(widths) == 1:
        return curve[widths[0]]
    for lo, hi in zip(widths, widths[1:], strict=False):
        if rows <= hi:
            return curve[lo] + (curve[hi] - curve[lo]) * (rows - lo) / (hi - lo)
    lo, hi = widths[-2], widths[-1]
    return curve[hi] + (curve[hi] - curve[lo]) * (rows - hi) / (hi - lo)


def best_budget(curve: dict[int, float], gain: dict[int, float], limit: int | None = None, draft_cost=None) -> int:
    """The budget b (a key of `gain`, <= limit) maximising gain[b] / (relative_cost(b + 1) +
    draft_cost(b)); 0 when no budget beats plain decoding (1 token per forward at cost 1).

    Args:
        draft_cost: budget -> what drafting a tree of that many nodes costs, in target steps (a
            model drafter's forwards); None: drafting is free next to a forward (model-free drafters).
    """
    best, best_rate = 0, 1.0
    for budget, tokens in sorted(gain.items()):
        if limit is not None and budget > limit:
            continue
        rate = tokens / (relative_cost(curve, budget + 1) + (draft_cost(budget) if draft_cost else 0.0))
        if rate > best_rate * 1.0001:
            best, best_rate = budget, rate
    return best


def tree_draft_forwards(budget: int, width: int) -> int:
    """Draft forwards a model drafter spends on a dynamic tree of `budget` nodes and `width` nodes
    per level (drafters/tree.py): the root's, then one per level that is expanded."""
    return max(1, -(-budget // width))
