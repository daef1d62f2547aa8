"""Speculative decoding of one request, chains and trees (method "sd"): the round loop
(`decoding/round.py`) over a batch of one.

A chain is a tree one node wide: every round's draft is a `TokenTree`, the target scores it in one
forward and the accepted path is kept. What differs is only how a round is asked for and checked:
- a chain (`shape` None) is asked for with the draft-length policy (`adaptive.ChainBudget`), scored
  by a plain causal extend (every runtime), verified by the tree rules or a named lossy rule, and
  committed by rolling the target's cache back to the accepted length;
- a tree (`shape`: its node budget, `adaptive.TreeBudget`) is scored with depth positions and the
  tree's attention mask (native runtime), verified by the tree rules and committed by compacting
  the cache to the root and the accepted path.

The batched decoder (`decoding/batch.py`) runs the same round step over many rows. Cache ownership:
the target's cache owner is driven here; the drafter owns and syncs its own state. A drafter that
reads the target's states gets the committed rows as an argument after every forward
(`decoding/common.StateHandoff`); a proposal carrying shallow states (Kangaroo) is verified by the
remaining layers only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from quickdraft.config import SamplingConfig
from quickdraft.decoding.adaptive import ChainBudget, DraftPolicy, TreeBudget
from quickdraft.decoding.common import Generators, StateHandoff, prefill_step
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.round import Lane, RoundLoop, SoloTarget
from quickdraft.drafters.base import Drafter
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.target import Target
from quickdraft.types import Round
from quickdraft.verifiers import Verifier
from quickdraft.verifiers.base import TreeRule


class SpeculativeDecoder:
    """Draft with any Drafter, verify with any Verifier, chains or trees (method name "sd").

    Args:
        target: the target model and its cache (trees: the native runtime).
        drafter: drafts a path each round, or with `shape` a tree (`propose` with a `DraftRequest`).
        verifier: accepts/rejects a chain (lossless unless verifier.lossy); trees use the tree rules.
        make_policy: builds a fresh draft-length policy for each generation (chains).
        events: reported once with the first token (a tree that fell back, an auto-sized budget).
        shape: a tree's budget and shape; None drafts chains.
    """

    name = "sd"

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        verifier: Verifier,
        make_policy: Callable[[], DraftPolicy] | None,
        events: dict[str, int] | None = None,
        shape: TreeShape | None = None,
    ) -> None:
        if shape is not None and not target.supports_trees:
            raise QuickdraftError("token trees need the native runtime for the target (--runtime auto|native)")
        if shape is not None and not drafter.drafts_trees:
            raise QuickdraftError(f"drafter {drafter.name!r} cannot draft trees")
        self.target, self.drafter, self.verifier, self.make_policy = target, drafter, verifier, make_policy
        self.shape = shape
        self.events = dict(events or {})
        self.lossy = verifier.lossy
        self.handoff = StateHandoff.of(drafter, target)
        self.guard: DraftGuard | None = None  # drops to plain rounds while drafting loses (auto trees)
        # a chain's second choices beside it need tree verification: a tree-capable target, a lossless rule
        self.siblings = target.supports_trees and not verifier.lossy

    @classmethod
    def tree(
        cls, target: Target, drafter: Drafter, shape: TreeShape, events: dict[str, int] | None = None
    ) -> SpeculativeDecoder:
        """Tree speculative decoding (`--draft-tree N`): a tree of `shape` drafted each round and
        verified in one forward by the lossless tree rules (native runtime: depth positions and the
        tree's mask, then the cache compacted to the accepted path)."""
        return cls(target, drafter, TreeRule(), None, events, shape=shape)

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        """Yield one Round per target forward until the consumer stops."""
        budget = TreeBudget(self.shape) if self.shape is not None else ChainBudget(self.make_policy(), self.siblings)
        loop = RoundLoop(SoloTarget(self.target, self.handoff), budget, self.verifier, self.guard)
        self.drafter.begin(prompt_ids, max_new_tokens)
        first = prefill_step(self.target, prompt_ids, sampling, generators, self.handoff)
        first.events = dict(self.events)
        yield first
        lane = Lane(list(prompt_ids) + first.tokens, sampling, generators, self.drafter, self.handoff.layers)
        produced = 1
        if self.guard is not None:
            self.guard.reset()
        while True:
            (rnd,) = loop.step([lane], [max_new_tokens - produced - 1])  # room for the next token
            produced += len(rnd.tokens)
            yield rnd
