"""Tree speculative decoding: draft a token tree, verify it in one target forward, keep the
accepted path (method "sd" with a tree budget, `--draft-tree N`).

Cache ownership: the target's cache owner (native runtime) is extended by [last committed token,
tree nodes] with depth positions and the tree's attention mask, then compacted to the root and the
accepted path; the drafter owns and syncs its own state, as in chain decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from quickdraft.config import SamplingConfig
from quickdraft.decoding.common import Generators, StateHandoff, prefill_step
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import logits_to_probs
from quickdraft.types import Round
from quickdraft.verifiers.base import TreeRule
from quickdraft.verifiers.tree import TokenTree, verify_tree_greedy, verify_tree_sampling


class TreeDecoder:
    """Draft a tree with `drafter.propose_tree`, verify all of it with one target forward.

    Args:
        target: a NativeCachedModel (tree masks and compaction).
        drafter: anything with `begin` and `propose_tree(context, shape, sampling, generator)`.
        shape: the tree's budget and shape.
        events: reported once with the first token (an auto-sized budget: `tree_budget_auto`).
        lossy: always False (the tree rules are lossless).
    """

    name = "sd"
    lossy = False

    def __init__(self, target, drafter, shape: TreeShape, events: dict[str, int] | None = None) -> None:
        if not target.supports_trees:
            raise QuickdraftError("token trees need the native runtime for the target (--runtime auto|native)")
        if not drafter.drafts_trees:
            raise QuickdraftError(f"drafter {drafter.name!r} cannot draft trees")
        self.target, self.drafter, self.shape = target, drafter, shape
        self.events = dict(events or {})
        self.handoff = StateHandoff.of(drafter, target)  # a feature head reads the target's states
        self.verifier = TreeRule()

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        self.drafter.begin(prompt_ids)
        first = prefill_step(self.target, prompt_ids, sampling, generators.target, self.handoff)
        first.events = dict(self.events)
        yield first
        context = list(prompt_ids) + first.tokens
        produced = 1
        while True:
            start = time.perf_counter()
            budget = min(self.shape.budget, max_new_tokens - produced - 1)
            tree = None
            if budget > 0:
                shape = TreeShape(budget, self.shape.width, self.shape.widths)
                tree = self.drafter.propose_tree(context, shape, sampling, generators.draft)
            mid = time.perf_counter()
            tokens = [] if tree is None else tree.tokens
            base = self.target.length
            if tokens:
                positions = [base] + [base + d for d in tree.depths]
                out = self.handoff.forward(
                    self.target, [context[-1], *tokens], positions=positions, tree_mask=tree.mask()
                )
            else:
                out = self.handoff.forward(self.target, [context[-1]])
            logits = out.logits
            if sampling.greedy:
                path, next_token = verify_tree_greedy(tree, logits) if tokens else ([], int(logits[0].argmax()))
            else:
                p = logits_to_probs(logits, sampling)  # (n+1, V)
                path, next_token = verify_tree_sampling(tree or TokenTree(), p, generators.target)
            self.handoff.hand_over(out, [0] + [1 + i for i in path])  # the committed rows
            if tokens:
                self.target.compact([0] + [1 + i for i in path])
            new_tokens = [tokens[i] for i in path] + [next_token]
            context += new_tokens
            produced += len(new_tokens)
            depth = max(tree.depths) if tokens else 0
            yield Round(
                new_tokens,
                len(tokens),
                len(path),
                draft_s=mid - start,
                verify_s=time.perf_counter() - mid,
                events={"tree_rounds": 1, "tree_nodes": len(tokens), f"accepted_depth_{len(path)}": 1}
                if tokens
                else {},
                draft_depth=depth,
            )
