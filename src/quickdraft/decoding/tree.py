"""Tree speculative decoding (method "sd" with a tree budget, `--draft-tree N`): the one round loop
of `decoding/vanilla.py` with a tree shape. The target's cache owner (native runtime) is extended by
[last committed token, tree nodes] with depth positions and the tree's attention mask, then
compacted to the root and the accepted path; the drafter owns and syncs its own state."""

from __future__ import annotations

from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters.tree import TreeShape
from quickdraft.verifiers.base import TreeRule


class TreeDecoder(SpeculativeDecoder):
    """Draft a tree each round (`drafter.propose` with the tree shape), verify all of it with one
    target forward (lossless tree rules; `events` are reported once with the first token, e.g. an
    auto-sized budget)."""

    def __init__(self, target, drafter, shape: TreeShape, events: dict[str, int] | None = None) -> None:
        super().__init__(target, drafter, TreeRule(), None, events, shape=shape)
