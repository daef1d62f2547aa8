"""The Drafter protocol.

A drafter proposes up to k tokens continuing the committed sequence. It owns whatever state it
needs (a model drafter owns its CachedModel) and reconciles that state with the committed sequence
at the start of every `propose` call, so decode loops never touch a drafter's cache and rejected or
never-fed drafts (the all-accepted off-by-one) are handled in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from quickdraft.config import SamplingConfig
from quickdraft.types import Proposal

# Called with the draft's raw logits row (V,) after each drafted token; False stops the round.
KeepDrafting = Callable[[torch.Tensor], bool]


class Drafter(Protocol):
    """Proposes draft tokens. `name` labels statistics and reports."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a new sequence (drop state tied to an earlier one)."""

    def propose(
        self,
        context: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        """Propose up to `num_draft_tokens` tokens continuing `context` (the committed ids).

        In sampling mode a drafter with a distribution must sample each token from exactly the
        processed q it returns; deterministic drafters return q_probs=None.
        """
        ...

    def step_seconds(self) -> float | None:
        """Measured seconds of one draft step, or None when drafting costs next to nothing (no model).
        Used to size PEARL's window; may reset the drafter's state (call between generations)."""
        ...


def empty_proposal() -> Proposal:
    return Proposal(tokens=torch.zeros(0, dtype=torch.long), q_probs=None)


def drafter_step_seconds(drafter: Drafter | None) -> float | None:
    """The drafter's own measured cost of one draft step; None without a drafter, for model-free
    drafters, and for drafters written before the protocol had `step_seconds`."""
    measure = getattr(drafter, "step_seconds", None)
    return measure() if measure is not None else None
