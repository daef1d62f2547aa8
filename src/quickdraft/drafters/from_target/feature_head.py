"""EAGLE-style feature-head drafting: one decoder layer over the target's own last hidden states.

The head's row t reads (f_t, x_{t+1}): the target's final-normed state at position t and the
embedding of the token after it, and predicts f_{t+1}, which the target's LM head (optionally
restricted to K ids) turns into the distribution of x_{t+2}. After the first draft token the head
drafts on its own predicted features (EAGLE's autoregression at the feature level).

State: `feats` holds the target's features of the committed tokens but the last (the decoder
passes them through `observe` after every target forward: len(feats) == len(context) - 1), and the
head's own cache `kv` holds rows built from true features only; rows built while drafting (on
predicted features) are dropped at the end of every `propose`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import FEATURES, Drafter, DraftRequest, draft_path, draft_token
from quickdraft.drafters.from_target.reuse import HeadLM, reusing_builder
from quickdraft.drafters.kinds import DrafterKind
from quickdraft.drafters.tree import grow_tree
from quickdraft.models.draft_heads import FeatureHead, block_cache
from quickdraft.verifiers.tree import TokenTree


class FeatureRows(Drafter):
    """What drafters over the target's features share: the features from `observe`, the module's
    cache of rows built on true features, catching it up to the committed context."""

    target_layers = (FEATURES,)

    def __init__(self, head: FeatureHead, lm: HeadLM, name: str = "head") -> None:
        self.head, self.lm, self.name = head, lm, name
        self.feats: list[torch.Tensor] = []
        self.draft_steps = 0  # head forwards since `begin` (the bench's cost model)
        self.kv = block_cache(head.cfg, lm.embed.dtype, lm.embed.device)

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        self.feats, self.draft_steps = [], 0
        self.kv.rollback(0)

    def observe(self, states: dict[int, torch.Tensor]) -> None:
        self.feats.extend(states[FEATURES])

    def fork(self) -> FeatureRows:
        """A drafter for one more sequence of a batch: the same module, its own features and cache
        (the batched decoder hands each row's features to its own fork)."""
        twin = copy.copy(self)
        twin.feats, twin.draft_steps = [], 0
        twin.kv = block_cache(self.head.cfg, self.lm.embed.dtype, self.lm.embed.device)
        return twin

    def step_seconds(self) -> float:
        """Seconds of one head step (one row through the block and the LM head)."""
        import time

        kv, self.kv = self.kv, block_cache(self.head.cfg, self.lm.embed.dtype, self.lm.embed.device)
        x = self.lm.embed[:1]
        with torch.inference_mode():
            self._rows(x, torch.zeros(1, dtype=torch.long))
            start = time.perf_counter()
            for i in range(1, 6):
                self.lm.logits(self._rows(x, torch.tensor([i])))
        self.kv = kv
        return (time.perf_counter() - start) / 5

    def _rows(self, feats: torch.Tensor, tokens: torch.Tensor, positions=None, mask=None) -> torch.Tensor:
        """Feed rows (feats (m, H), next tokens (m,)) at the head cache's end -> (m, H) predictions
        (default: consecutive positions, causal)."""
        at = self.kv.length
        if positions is None:
            positions = torch.arange(at, at + feats.shape[0], device=feats.device)
        embeds = self.lm.embed[tokens.to(feats.device)][None]
        self.draft_steps += 1
        return self.head(feats[None], embeds, positions, self.kv, mask)[0]

    def _catch_up(self, context: Sequence[int]) -> torch.Tensor:
        """Feed the committed rows the head has not read; returns (1, H), the predicted feature of
        the last committed position (its LM-head row is the distribution of the next token)."""
        committed = len(context) - 1
        if len(self.feats) != committed:
            raise RuntimeError(
                f"{self.name} drafter: {len(self.feats)} target features for {committed} cached tokens "
                "(a decoder must pass every target forward's rows to observe)"
            )
        fed = self.kv.length  # head rows built on true features
        pending = torch.stack(self.feats[fed:committed])  # (m, H), m >= 1
        nxt = torch.tensor(list(context[fed + 1 : committed + 1]), dtype=torch.long)
        return self._rows(pending, nxt)[-1:]


class FeatureHeadDrafter(FeatureRows):
    """Drafts with a trained `FeatureHead` on the target's features (method sd; native runtime)."""

    drafts_trees = True

    @torch.inference_mode()
    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A chain, one head step per token, or a token tree (`_tree`); the rows built on predicted
        features are dropped at the end."""
        if request.budget < 1:
            return TokenTree()
        committed = len(context) - 1
        pred = self._catch_up(context)  # (1, H): predicted f_{committed}
        if request.shape is not None:
            tree = self._tree(pred, committed, request.shape, sampling, generator)
            self.kv.rollback(committed)
            return tree
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        keep = request.keep_drafting
        while True:
            logits = self.lm.logits(pred)[0]  # (V,)
            tokens.append(draft_token(logits, sampling, generator, q_rows))
            if len(tokens) == request.budget or (keep is not None and not keep(logits, len(tokens))):
                break
            pred = self._rows(pred, torch.tensor(tokens[-1:]))
        self.kv.rollback(committed)  # drop the rows built on predicted features
        return draft_path(tokens, q_rows)

    def _tree(self, root: torch.Tensor, committed: int, shape, sampling: SamplingConfig, generator) -> TokenTree:
        """A token tree (drafters/tree.py, EAGLE-2's dynamic expansion by default): each level is one
        head forward over its new nodes, each reading its parent's predicted feature. root: (1, H)."""
        outputs: list[torch.Tensor] = []  # predicted feature per fed node (in node order)

        def expand(tree, new: list[int]) -> torch.Tensor:
            parents = [tree.parents[i] for i in new]
            feats = torch.cat([root if p < 0 else outputs[p] for p in parents])
            full = tree.mask()[1:, 1:]
            seen = full[torch.tensor(new)][:, : len(outputs) + len(new)]
            mask = torch.cat([torch.ones(len(new), committed, dtype=torch.bool), seen], dim=1).to(feats.device)
            positions = torch.tensor([committed - 1 + tree.depths[i] for i in new], device=feats.device)
            out = self._rows(feats, torch.tensor([tree.tokens[i] for i in new]), positions, mask)
            outputs.extend(out.split(1))
            return self.lm.logits(out)

        return grow_tree(self.lm.logits(root)[0], expand, shape, sampling, generator)


def _from_module(module: FeatureHead, lm: HeadLM, eta: float, name: str) -> FeatureHeadDrafter:
    return FeatureHeadDrafter(module, lm, name=name)


KIND = DrafterKind(
    name="head",
    usage="head[:PATH]",
    summary="an EAGLE-style feature head on the target's last hidden states (native runtime)",
    build=reusing_builder(FeatureHead, _from_module),
    reads_target="features",
    drafts_trees=True,
    module=FeatureHead,
    from_module=_from_module,
    decode_length=4,
    trained_by="train-draft",
    asset="head",
)
