"""Trees that mix sources: suffix branches and a model drafter's branches in one tree (`mix[:STAGE]`).

SAM-Decoding's rule of thumb: trust a long suffix match, fall back to the model where the match is
short. Here:
- greedy rounds take the union of both: the suffix drafter's paths scored by empirical path
  probability, the model's tree (STAGE, default the feature head `head`) scored by its cumulative
  draft probability; the `budget` best paths form one prefix-closed tree. Every node is a
  deterministic function of the context, so the greedy tree rule keeps the output exactly the
  target's;
- sampling rounds take one source per round, chosen from the context alone: the suffix tree when
  its longest match has at least `min_match` tokens, else the model's sampled tree. Never mixing
  deterministic and sampled siblings under one parent keeps the sibling rejection rule lossless.
Chains (`--draft-tree 0`) follow the same switch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import ComposedReads, KeepDrafting, empty_proposal
from quickdraft.drafters.kinds import KINDS, DrafterKind, DrafterSpec, stage_dtype
from quickdraft.drafters.spec import parse_mix
from quickdraft.drafters.suffix import (
    CHAIN_TREE_FACTOR,
    SuffixDrafter,
    build_suffix,
    greedy_chain,
    merge_scores,
    paths_to_tree,
)
from quickdraft.errors import QuickdraftError
from quickdraft.types import Proposal
from quickdraft.verifiers.tree import TokenTree

MIN_MATCH = 4  # a suffix match this long drafts alone in sampling rounds and chains


def tree_paths(tree: TokenTree) -> dict[tuple[int, ...], float]:
    """{path of token ids: score} of every node of a scored tree."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tree.tokens, tree.parents, strict=True):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return dict(zip(paths, tree.scores, strict=True))


class MixedTreeDrafter(ComposedReads):
    """Suffix and model branches in one tree (module docstring).

    Args:
        suffix: the suffix drafter.
        model: a drafter that drafts scored trees (`propose_tree`; the feature head, a draft model).
        min_match: the suffix match length that makes a sampling round (or a chain) suffix-only.
    """

    drafts_trees = True

    def __init__(self, suffix: SuffixDrafter, model, min_match: int = MIN_MATCH, name: str = "mix") -> None:
        if not model.drafts_trees:
            raise QuickdraftError(f"mix: the drafter {model.name!r} cannot draft trees")
        self.suffix, self.model, self.min_match, self.name = suffix, model, min_match, name
        self.parts = [suffix, model]  # ComposedReads: a target-reading model is bound and fed
        self.rounds_by_source = {"union": 0, "suffix": 0, "model": 0}

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.suffix.begin(prompt_ids)
        self.model.begin(prompt_ids)

    def step_seconds(self) -> float | None:
        return self.model.step_seconds()

    def _long_match(self, context: Sequence[int], budget: int):
        scored, longest = self.suffix.scored(context, budget)
        return scored, longest >= self.min_match

    def propose_tree(self, context: Sequence[int], shape, sampling: SamplingConfig, generator) -> TokenTree:
        scored, long_match = self._long_match(context, shape.budget)
        if not sampling.greedy:
            source = "suffix" if long_match and scored else "model"
            self.rounds_by_source[source] += 1
            if source == "suffix":
                return paths_to_tree(merge_scores([scored], shape.budget))
            return self.model.propose_tree(context, shape, sampling, generator)
        self.rounds_by_source["union"] += 1
        model_tree = self.model.propose_tree(context, shape, sampling, generator)
        return paths_to_tree(merge_scores([scored, tree_paths(model_tree)], shape.budget))

    def propose(
        self,
        context: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        if num_draft_tokens < 1:
            return empty_proposal()
        budget = num_draft_tokens * CHAIN_TREE_FACTOR
        scored, long_match = self._long_match(context, budget)
        if long_match and scored:  # the suffix drafter's own chain, from the search just made
            self.rounds_by_source["suffix"] += 1
            chain = greedy_chain(merge_scores([scored], budget), num_draft_tokens)
            return Proposal(tokens=torch.tensor(chain, dtype=torch.long))
        self.rounds_by_source["model"] += 1
        return self.model.propose(context, num_draft_tokens, sampling, generator, keep_drafting)


def _build(spec: DrafterSpec, target, dtype: str, runtime: str) -> MixedTreeDrafter:
    """The shipped suffix datastore's drafter and the model stage (default the feature head) in one tree."""
    stage = parse_mix(spec.arg)
    model = KINDS[stage.kind].build(stage, target, stage_dtype(stage, dtype), runtime)
    return MixedTreeDrafter(build_suffix(DrafterSpec("suffix"), target), model, name=str(spec))


KIND = DrafterKind(
    name="mix",
    usage="mix[:STAGE]",
    summary="suffix branches and a model drafter's in one tree (default STAGE: the feature head)",
    build=_build,
    check_arg=parse_mix,
    has_model=False,
    drafts_trees=True,
)
