"""An independent draft model (any causal LM sharing the target's vocabulary).

Drafting calls the model's forward directly through a CachedModel, one token per step with the LM
head on the last position only; `transformers.generate()` is avoided because its per-call set-up
dominates a small model's step on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import KeepDrafting, draft_token, empty_proposal
from quickdraft.models.cached_model import CachedModel
from quickdraft.types import Proposal
from quickdraft.verifiers.tree import TokenTree


class ModelDrafter:
    """Autoregressive drafting with a small model that owns its own KV cache.

    Cache ownership: this object's CachedModel. At each `propose` the cache is synced to the
    committed context (rejected drafts dropped, unfed tokens such as the last accepted draft and the
    bonus token fed), then k tokens are drafted; the last drafted token is never fed.
    """

    def __init__(self, model: CachedModel, name: str = "model") -> None:
        self.model = model
        self.name = name

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.model.reset()
        self._forwards_at_begin = self.model.num_forwards

    @property
    def draft_steps(self) -> int:
        """Draft-model forwards since `begin` (the bench's cost model)."""
        return self.model.num_forwards - getattr(self, "_forwards_at_begin", 0)

    def step_seconds(self) -> float:
        """Measured seconds of one draft step (a single-token cached forward); resets the cache."""
        from quickdraft.models.timing import step_seconds

        return step_seconds(self.model)

    def propose(
        self,
        context: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        # a draft with a shorter context than the target stops drafting near its limit (plain steps)
        num_draft_tokens = min(num_draft_tokens, self.model.max_length - len(context))
        if num_draft_tokens < 1:
            return empty_proposal()
        logits = self.model.sync(context)[-1]  # (V,)
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        while True:
            token = draft_token(logits, sampling, generator, q_rows)
            tokens.append(token)
            if len(tokens) == num_draft_tokens or (keep_drafting is not None and not keep_drafting(logits)):
                break
            logits = self.model.extend([token], last_only=True)[-1]
        return Proposal(
            tokens=torch.tensor(tokens, dtype=torch.long),
            q_probs=torch.stack(q_rows) if q_rows else None,
        )

    @torch.inference_mode()
    def review(self, context: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """One forward over proposed `tokens` after `context` (CS Drafting's review): (m+1, V) logits
        of this model at the positions predicting tokens[0..m-1] and the one after them."""
        self.model.rollback(min(self.model.length, len(context) - 1))  # so the rows below are all fed
        return self.model.sync(list(context) + list(tokens), last_only=False)[-(len(tokens) + 1) :]

    def propose_tree(self, context: Sequence[int], shape, sampling: SamplingConfig, generator) -> TokenTree:
        """A token tree of at most `shape.budget` nodes (drafters/tree.py); the cache ends at `context`."""
        from quickdraft.drafters.tree import TreeShape, model_tree

        budget = min(shape.budget, self.model.max_length - len(context) - 1)
        if budget < 1:
            return TokenTree()
        return model_tree(self.model, context, TreeShape(budget, shape.width, shape.widths), sampling, generator)
