"""Draft-length policies: how many tokens to draft next round, and when to stop drafting early.

Each policy has three small methods: `num_draft_tokens()` before a round, `keep_drafting(logits)`
after each drafted token (None = never stop early), and `update(num_drafted, num_accepted)` after.
All of them only change gamma, never the verification rule, so they keep decoding lossless.
`ChainBudget` and `TreeBudget` grant a lone sequence's round its draft (the round loop's `Budget`;
a batch's is `decoding/batch_plan.BatchPlan`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from quickdraft.config import DraftConfig
from quickdraft.drafters.base import DraftRequest
from quickdraft.drafters.tree import TreeShape


class DraftPolicy(Protocol):
    keep_drafting: object

    def num_draft_tokens(self) -> int: ...

    def update(self, num_drafted: int, num_accepted: int) -> None: ...


class FixedLength:
    """Always gamma tokens."""

    keep_drafting = None

    def __init__(self, num_draft_tokens: int) -> None:
        self.gamma = num_draft_tokens

    def num_draft_tokens(self) -> int:
        return self.gamma

    def update(self, num_drafted: int, num_accepted: int) -> None:
        pass


class HeuristicLength(FixedLength):
    """transformers' "heuristic" schedule: +2 after a fully accepted draft, -1 (min 1) otherwise."""

    def __init__(self, num_draft_tokens: int, max_num_draft_tokens: int = 16) -> None:
        super().__init__(num_draft_tokens)
        self.cap = max_num_draft_tokens

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        if num_accepted == num_drafted:
            self.gamma = min(self.cap, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)


class ConfidenceStop(FixedLength):
    """Draft up to gamma tokens, stopping after a token whose draft top-1 probability is < threshold
    (transformers' assistant_confidence_threshold; Kangaroo's eta rule)."""

    def __init__(self, num_draft_tokens: int, threshold: float) -> None:
        super().__init__(num_draft_tokens)
        self.threshold = threshold

    def keep_drafting(self, logits: torch.Tensor) -> bool:
        return bool(torch.softmax(logits.float(), -1).max() >= self.threshold)


def make_draft_policy(config: DraftConfig) -> DraftPolicy:
    """A fresh policy (policies hold per-generation state) for the configured schedule."""
    if config.schedule == "heuristic":
        return HeuristicLength(config.num_draft_tokens, config.max_num_draft_tokens)
    if config.schedule == "confidence":
        return ConfidenceStop(config.num_draft_tokens, config.confidence_threshold)
    return FixedLength(config.num_draft_tokens)


class ChainBudget:
    """A lone sequence's chains (`decoding/round.Budget`): the policy's length, at most the room left."""

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy

    def request(self, rows: int, room: int) -> DraftRequest | None:
        k = min(self.policy.num_draft_tokens(), room)
        return DraftRequest.chain(k, self.policy.keep_drafting) if k >= 1 else None

    def observe(self, drafted: list[tuple[int, int]]) -> None:
        for num_drafted, num_accepted in drafted:
            self.policy.update(num_drafted, num_accepted)


class TreeBudget:
    """A lone sequence's trees (`decoding/round.Budget`): one shape, cut to the room left."""

    def __init__(self, shape: TreeShape) -> None:
        self.shape = shape

    def request(self, rows: int, room: int) -> DraftRequest | None:
        request = DraftRequest.tree(self.shape).within(room)
        return request if request.budget >= 1 else None

    def observe(self, drafted: list[tuple[int, int]]) -> None:
        pass
