"""CS Drafting's cost model: standardized walltime improvement (SWI), beside measured wall time.

Each model's forward costs its measured step time relative to the target's (the target 1, a
model-free drafter 0), counted per call: SWI = new tokens / (target forwards + sum over draft
components of forwards x relative cost). Plain decoding has SWI 1. Unlike wall time it ignores
Python overhead, sampling and verification arithmetic, so the gap between the two shows how much a
method loses outside the forwards.
"""

from __future__ import annotations

from quickdraft.costs.timing import step_seconds


def components(drafter) -> list:
    """The drafters whose forwards are counted: a cascade's levels, a chain's stages, a mixed tree's
    sources (`Drafter.components`), else itself."""
    return [] if drafter is None else drafter.components()


def relative_costs(engine) -> list[float]:
    """Step cost of each component relative to the target's step, measured once (between runs)."""
    parts = components(engine.drafter)
    if not parts:
        return []
    target = step_seconds(engine.target)
    return [(d.step_seconds() or 0.0) / target if target > 0 else 0.0 for d in parts]


def draft_steps(engine) -> list[int]:
    """Forward calls of each draft component in the last generation (a cascade counts per level)."""
    return [] if engine.drafter is None else engine.drafter.component_steps()
