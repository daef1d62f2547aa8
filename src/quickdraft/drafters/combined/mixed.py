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
Chains (`--draft-tree 0`) follow the same switch, and take the model stage's default chain (`pmin`: a
draft model's p-min chain, priced on this host's costs) where no draft option is given: the suffix chain
after a long match is a deterministic lookup and stops where its paths do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import ComposedReads, DraftRequest, draft_path
from quickdraft.drafters.kinds import KINDS, DrafterKind, DrafterSpec, stage_dtype
from quickdraft.drafters.model_free.suffix import CHAIN_TREE_FACTOR, SuffixDrafter, build_suffix
from quickdraft.drafters.model_free.suffix_trie import greedy_chain, merge_scores, paths_to_tree
from quickdraft.drafters.spec import parse_stage
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.tree import TokenTree

MIN_MATCH = 4  # a suffix match this long drafts alone in sampling rounds and chains


def parse_mix(arg: str | None) -> DrafterSpec:
    """`mix[:STAGE]`: suffix branches plus the tree-drafting STAGE's (default `head`, the feature head)."""
    stage = parse_stage(arg or "head", f"mix:{arg or 'head'}")
    if not (KINDS[stage.kind].has_model and KINDS[stage.kind].drafts_trees):
        able = ", ".join(k.name for k in KINDS.values() if k.has_model and k.drafts_trees)
        raise QuickdraftError(
            f"drafter 'mix:{arg}': the second source must be a model drafter that drafts trees ({able})"
        )
    return stage


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
        model: a drafter that drafts scored trees (the feature head, a draft model).
        min_match: the suffix match length that makes a sampling round (or a chain) suffix-only.
    """

    drafts_trees = True

    def __init__(self, suffix: SuffixDrafter, model, min_match: int = MIN_MATCH, name: str = "mix") -> None:
        if not model.drafts_trees:
            raise QuickdraftError(f"mix: the drafter {model.name!r} cannot draft trees")
        self.suffix, self.model, self.min_match, self.name = suffix, model, min_match, name
        self.parts = [suffix, model]  # ComposedReads: a target-reading model is bound and fed
        self.rounds_by_source = {"union": 0, "suffix": 0, "model": 0}

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        self.suffix.begin(prompt_ids, budget)
        self.model.begin(prompt_ids, budget)

    @property
    def pmin(self) -> tuple[int, float] | None:  # type: ignore[override]
        """The model stage's default chain (a draft model's p-min chain; None: fixed chains)."""
        return self.model.pmin

    def step_seconds(self) -> float | None:
        return self.model.step_seconds()

    def fork(self) -> MixedTreeDrafter | None:
        """Both sources forked (None when either cannot be)."""
        suffix, model = self.suffix.fork(), self.model.fork()
        if suffix is None or model is None:
            return None
        return MixedTreeDrafter(suffix, model, self.min_match, self.name)

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A tree: greedy, the union of both trees; sampled, one source's tree (see the module
        docstring). A chain: the suffix drafter's own path after a long match, else the model's."""
        if request.budget < 1:
            return TokenTree()
        budget = request.budget if request.shape is not None else request.budget * CHAIN_TREE_FACTOR
        scored, longest = self.suffix.scored(context, budget)
        long_match = longest >= self.min_match and bool(scored)
        if request.shape is None or not sampling.greedy:  # one source, chosen from the context
            self.rounds_by_source["suffix" if long_match else "model"] += 1
            if not long_match:
                return self.model.propose(context, request, sampling, generator)
            paths = merge_scores([scored], budget)  # the suffix drafter's own draft, from the search just made
            return (
                paths_to_tree(paths) if request.shape is not None else draft_path(greedy_chain(paths, request.budget))
            )
        self.rounds_by_source["union"] += 1
        model_tree = self.model.propose(context, request, sampling, generator)
        return paths_to_tree(merge_scores([scored, tree_paths(model_tree)], budget))


def _build(spec: DrafterSpec, target, dtype: str, runtime: str) -> MixedTreeDrafter:
    """The shipped suffix datastore's drafter and the model stage (default the feature head) in one tree."""
    stage = spec.value
    model = KINDS[stage.kind].build(stage, target, stage_dtype(stage, dtype), runtime)
    return MixedTreeDrafter(build_suffix(DrafterSpec.of("suffix"), target), model, name=str(spec))


KIND = DrafterKind(
    name="mix",
    usage="mix[:STAGE]",
    summary="suffix branches and a model drafter's in one tree (default STAGE: the feature head)",
    build=_build,
    parse_arg=parse_mix,
    takes_dtype=True,
    has_model=False,
    drafts_trees=True,
)
