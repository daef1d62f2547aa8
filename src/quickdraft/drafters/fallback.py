"""A fallback chain of drafters ("A+B"): the first drafter that proposes anything drafts the round.

The useful case is prompt lookup in front of a draft model ("ngram:3:2+distilled"): where the
context repeats itself (extraction, summarisation, code edits) the free n-gram copy drafts, and
elsewhere the model does. It is the statistical-bottom idea of CS Drafting used sideways: the
cheap drafter is tried first rather than consulted by the expensive one.

Losslessness is untouched: which drafter drafts depends only on the committed context, and each
round's proposal carries its own q (None for the deterministic n-gram copy, the model's processed
rows otherwise), which the verifier uses as it would for that drafter alone. A model drafter that
sat out some rounds catches its cache up on its next `propose` (one forward over the missed
tokens), so the chain needs no cache logic of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import ComposedReads, Drafter, DraftRequest
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.tree import TokenTree


class FallbackDrafter(ComposedReads):
    """Ask each drafter in order; the first non-empty proposal is the round's.

    Attributes:
        drafters: the chain, tried first to last.
        rounds_by_drafter: how many rounds each drafter drafted (same order), for reports.
    """

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        if len(drafters) < 2:
            raise QuickdraftError("a fallback chain needs at least two drafters, e.g. ngram:3:2+distilled")
        self.drafters = list(drafters)
        self.parts = self.drafters  # ComposedReads: stages that read the target are bound and fed
        self.name = "+".join(d.name for d in self.drafters)
        self.rounds_by_drafter = [0] * len(self.drafters)

    @property
    def drafts_trees(self) -> bool:
        return all(d.drafts_trees for d in self.drafters)

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt_ids, budget)

    def fork(self) -> FallbackDrafter | None:
        """Every stage forked (None when one cannot be)."""
        stages = [d.fork() for d in self.drafters]
        return None if any(s is None for s in stages) else FallbackDrafter(stages)

    def step_seconds(self) -> float | None:
        """The costliest stage's step (None when no stage has a model): the chain's worst case."""
        costs = [c for d in self.drafters if (c := d.step_seconds()) is not None]
        return max(costs) if costs else None

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """The first stage's non-empty draft (a chain-only stage asked for a tree refuses by name)."""
        draft = TokenTree()
        for i, drafter in enumerate(self.drafters):
            draft = drafter.propose(context, request, sampling, generator)
            if len(draft):
                self.rounds_by_drafter[i] += 1
                return draft
        return draft
