"""What decoders are built from (`DecodeParts`: the target, the drafter, the options and a per-engine
memo) and what is measured once per engine to price a round on this host: the verify-cost curve, a
draft step and a drafter's lookups in target steps (`host_costs`, `drafting`), and the prices the auto
tree budget and the draft guard read (`draft_cost`, `round_cost`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from quickdraft.config import DraftConfig
from quickdraft.costs.timing import paired_ratio, step_seconds
from quickdraft.decoding.pearl_logic import PearlConfig
from quickdraft.drafters.base import Drafter, drafter_step_seconds
from quickdraft.runtime.target import Target


class DecodeOptions(Protocol):
    """What decoders read of the engine's options (`options.EngineConfig` is one). A protocol, so
    this module never imports the options module, which imports it for the method table."""

    drafter: str
    drafter_stages: tuple  # the parsed `drafter` (drafters.kinds.DrafterSpec stages)
    draft: DraftConfig
    verifier: str | None
    pearl: PearlConfig
    dtype: str
    runtime: str
    quantize: str


@dataclass
class DecodeParts:
    """What decoders are built from: the target's cache owner, the drafter, the options, a per-engine
    memo of what is measured once (PEARL's gamma, the tree budget) and what a decoder started once
    and `close` stops (PEARL's worker processes)."""

    target: Target
    drafter: Drafter | None
    config: DecodeOptions
    target_name: str | None = None
    memo: dict = field(default_factory=dict)
    started: dict = field(default_factory=dict)  # name -> an object with close()

    def held(self) -> int:
        """The KV cache bytes a lone generation holds now: the target's and a draft model's."""
        return getattr(self.target, "kv_bytes", 0) + (self.drafter.kv_bytes() if self.drafter is not None else 0)

    def close(self) -> None:
        """Stop whatever a decoder started (worker processes)."""
        for value in list(self.started.values()):
            value.close()
        self.started.clear()
        self.memo.clear()


def host_costs(parts: DecodeParts) -> tuple[dict[int, float], float | None, float]:
    """(this host's verify-cost curve for the target, a model drafter's step in target steps or None
    for a model-free drafter, the drafter's lookups a round in target steps), measured once per
    engine (once per host for the embedded default and the named targets: `costs/cost_curve.py`). Only
    targets that verify trees (the native runtime) have a curve."""
    if "host_costs" not in parts.memo:
        from quickdraft.costs.cost_curve import cost_curve

        curve = cost_curve(parts.target, parts.target_name or "", parts.config.dtype, **_persist(parts))
        parts.memo["host_costs"] = (curve, *drafting(parts))
    return parts.memo["host_costs"]


def _persist(parts: DecodeParts) -> dict:
    """Whether this target's host measurements are kept in the cache folder: the embedded default's and
    a named target's (weights fixed by checksum; the Qwen pair's curve took 20 s a process to measure)."""
    from quickdraft.weights.default import fixed_weights

    return {"persist": fixed_weights(parts.target_name or ""), "weights": parts.config.quantize}


def drafting(parts: DecodeParts) -> tuple[float | None, float]:
    """(a model drafter's step in target steps or None, its lookups a drafted round in target steps),
    once per engine (`costs/cost_curve.drafting_costs`: once per host for the default and named targets)."""
    if "drafting" not in parts.memo:
        from quickdraft.costs.cost_curve import drafting_costs

        def measure() -> tuple[float | None, float]:
            lookup = None if parts.drafter is None else parts.drafter.lookup_seconds()
            if drafter_step_seconds(parts.drafter) is None:  # model-free (else this first step warms it up)
                step = step_seconds(parts.target) if lookup is not None else 1.0
                return None, 0.0 if lookup is None else lookup / step
            ratio, step = paired_ratio(lambda: drafter_step_seconds(parts.drafter), lambda: step_seconds(parts.target))
            return ratio, 0.0 if lookup is None else lookup / step

        name = "none" if parts.drafter is None else parts.drafter.name
        key = f"{parts.config.drafter}|{name}"
        parts.memo["drafting"] = drafting_costs(
            parts.target_name or "", parts.config.dtype, **_persist(parts), drafter_key=key, measure=measure
        )
    return parts.memo["drafting"]


def draft_cost(parts: DecodeParts, chain: bool) -> Callable[[int], float]:
    """nodes drafted -> what drafting them costs, in one-row target steps: a model drafter's
    forwards at their measured step (one per chain token; one per expanded level of a tree), plus
    the drafter's measured lookups (a suffix drafter's index search and tree building) once a
    drafted round."""
    from quickdraft.costs.cost_curve import tree_draft_forwards

    _, ratio, lookup = host_costs(parts)

    def cost(nodes: int) -> float:
        if not nodes:
            return 0.0
        forwards = (
            0.0 if ratio is None else ratio * (nodes if chain else tree_draft_forwards(nodes, auto_width(parts, nodes)))
        )
        return forwards + lookup

    return cost


def round_cost(parts: DecodeParts, chain: bool) -> Callable[[int, int], float]:
    """(rows verified, nodes drafted) -> a round's cost in one-row target steps on this host: the
    verify forward from the curve plus drafting (`draft_cost`)."""
    from quickdraft.costs.cost_curve import relative_cost

    curve = host_costs(parts)[0]
    drafts = draft_cost(parts, chain)
    return lambda rows, nodes: relative_cost(curve, rows) + drafts(nodes)


def auto_width(parts: DecodeParts, budget: int) -> int:
    """The tree width that goes with an auto budget: the one the drafter's gain table measured it
    at (a trained head's narrow trees at small budgets), else the configured width."""
    widths = parts.drafter.tree_gain_width if parts.drafter is not None else None
    return (widths or {}).get(budget, parts.config.draft.tree_width)
