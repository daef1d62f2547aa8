"""SpecDec's block drafting (arXiv 2203.16487), ported to a decoder-only target: a non-autoregressive
drafter proposes k tokens in one forward.

The drafter keeps the feature head's cache of rows over the committed prefix (the target's features
and the next tokens, `FeatureHeadDrafter`), then runs `block` learned mask queries after it, which see
the whole prefix and each other (bidirectional among the queries) and draft tokens 1..k at once. Each
draft token is drawn from its own query's q (independent of the other drafts: still a valid q for the
acceptance rule), so greedy and sampling verification stay lossless; Spec-Verification
(`--verifier specdec:beta=B,tau=T`) is the paper's lossy knob.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import DraftRequest, draft_path, draft_token
from quickdraft.drafters.from_target.feature_head import FeatureRows
from quickdraft.drafters.from_target.reuse import HeadLM, reusing_builder
from quickdraft.drafters.kinds import DrafterKind
from quickdraft.models.draft_heads import BlockDrafter
from quickdraft.verifiers.tree import TokenTree


class BlockDrafterRunner(FeatureRows):
    """Drafts with a trained `BlockDrafter` (method sd; native runtime); at most `block` tokens a round."""

    @torch.inference_mode()
    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A chain of up to `block` tokens from one forward of the block's queries."""
        self.refuse_tree(request)
        k = min(request.budget, self.head.cfg.block)
        if k < 1:
            return TokenTree()
        committed = len(context) - 1
        self._catch_up(context)  # prefix rows up to the last committed token
        positions = torch.arange(committed, committed + k, device=self.lm.embed.device)
        mask = torch.ones(k, committed + k, dtype=torch.bool, device=positions.device)  # prefix + all queries
        out = self.head.query(k, positions, self.kv, mask)[0]  # (k, H)
        self.draft_steps += 1
        self.kv.rollback(committed)  # queries are never kept
        logits = self.lm.logits(out)  # (k, V)
        q_rows: list[torch.Tensor] = []
        tokens = [draft_token(logits[j], sampling, generator, q_rows) for j in range(k)]
        return draft_path(tokens, q_rows)


def _from_module(module: BlockDrafter, lm: HeadLM, eta: float, name: str) -> BlockDrafterRunner:
    return BlockDrafterRunner(module, lm, name=name)


KIND = DrafterKind(
    name="specdec",
    usage="specdec[:PATH]",
    summary="SpecDec's non-autoregressive block drafter (native runtime)",
    build=reusing_builder(BlockDrafter, _from_module),
    reads_target="features",
    module=BlockDrafter,
    from_module=_from_module,
    decode_length=4,
    trained_by="train-draft",
    asset="specdec",
)
