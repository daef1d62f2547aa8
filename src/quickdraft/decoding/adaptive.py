"""Draft-length policies: how many tokens to draft next round, and when to stop drafting early.

Each policy has three small methods: `num_draft_tokens()` before a round, `keep_drafting(logits)`
after each drafted token (None = never stop early), and `update(num_drafted, num_accepted)` after.
All of them only change gamma, never the verification rule, so they keep decoding lossless.
`ChainBudget` and `TreeBudget` grant a lone sequence's round its draft (the round loop's `Budget`;
a batch's is `decoding/batch_plan.BatchPlan`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from quickdraft.config import DraftConfig
from quickdraft.drafters.base import DraftRequest
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError


class DraftPolicy(Protocol):
    keep_drafting: object
    sibling: object

    def num_draft_tokens(self) -> int: ...

    def update(self, num_drafted: int, num_accepted: int) -> None: ...


class FixedLength:
    """Always gamma tokens."""

    keep_drafting = None
    sibling = None  # the rule offering a chain position's second choice beside it (CostStop's), or none

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

    def keep_drafting(self, logits: torch.Tensor, depth: int = 1) -> bool:
        return bool(torch.softmax(logits.float(), -1).max() >= self.threshold)


class CostStop(FixedLength):
    """Draft up to gamma tokens while one more is expected to raise the round's tokens per step on this
    host (the "cost" schedule: the p-min chain sized from the host's costs, not from a fixed threshold).

    After the chain's token n (top-1 probability p_n), the round is expected to commit E_n = 1 + sum_i
    a_i tokens (a_i = p_1 ... p_i: the chance the first i drafts are all accepted; the 1 is the bonus or
    correction) at a cost of C_n = cost(n + 1 rows, n nodes) one-row target steps (the verify curve plus
    the draft steps: `round_cost` in decoding/parts.py, the draft guard's price of a round). It drafts
    on while E_{n+j} / C_{n+j} > E_n / C_n for some j <= lookahead, the next tokens taken to be as sure
    as token n: on a flat verify curve chains run long, where each row costs a third of a step (AVX2)
    they stop early. It only changes gamma, so decoding stays lossless.

    Args:
        cost: (rows verified, nodes drafted) -> a round's cost in one-row target steps.
        num_draft_tokens: the longest chain.
        lookahead: tokens looked ahead (a curve is not convex: one more row can cost nothing).
    """

    def __init__(self, cost: Callable[[int, int], float], num_draft_tokens: int, lookahead: int = 2) -> None:
        super().__init__(num_draft_tokens)
        self.cost, self.lookahead = cost, lookahead
        self._reach = self._tokens = 1.0

    def keep_drafting(self, logits: torch.Tensor, depth: int = 1) -> bool:
        return self.keep(float(torch.softmax(logits.float(), -1).max()), depth)

    def keep(self, p: float, depth: int) -> bool:
        """Whether to draft token depth + 1, having drafted token `depth` (1 starts a chain) at top-1 p."""
        if depth == 1:
            self._reach = self._tokens = 1.0
        self._reach *= p
        self._tokens += self._reach
        now = self._tokens / self.cost(depth + 1, depth)
        reach, tokens = self._reach, self._tokens
        for ahead in range(1, self.lookahead + 1):
            reach *= p
            tokens += reach
            if tokens / self.cost(depth + ahead + 1, depth + ahead) > now:
                return True
        return False

    def sibling(self, p1: float, p2: float, depth: int, rows: int) -> bool:
        """Whether the draft's second choice at chain position `depth` (top-1 p1, top-2 p2) joins the
        verify as a leaf beside the chain's token (`DraftRequest.siblings`). It is accepted where the
        first `depth - 1` drafts are and the target takes it over the chain's token: about a_{depth-1} p2
        tokens more (the chain's token there then takes the correction's place). It joins when that gain
        over the one row it adds (the curve from `rows` to `rows + 1`, at least MIN_ROW steps) is at least
        the round's expected tokens per step so far: a flat curve takes most siblings, a steep one few.
        Called before `keep` for the same position."""
        reach = 1.0 if depth == 1 else self._reach
        tokens = (1.0 if depth == 1 else self._tokens) + reach * p1
        now = self.cost(rows, depth)
        row = max(self.cost(rows + 1, depth) - now, MIN_ROW)
        return reach * p2 * now >= row * tokens


MIN_ROW = 0.01  # a verify row's least price in one-row steps (a measured curve can be flat, or dip, there)


def make_draft_policy(config: DraftConfig, cost: Callable[[int, int], float] | None = None) -> DraftPolicy:
    """A fresh policy (policies hold per-generation state) for the configured schedule; `cost` (a round's
    price on this host: `round_cost` in decoding/parts.py) prices the "cost" schedule."""
    if config.schedule == "cost":
        if cost is None:
            raise QuickdraftError("the cost draft schedule needs this host's measured costs (a native target)")
        return CostStop(cost, config.num_draft_tokens)
    if config.schedule == "heuristic":
        return HeuristicLength(config.num_draft_tokens, config.max_num_draft_tokens)
    if config.schedule == "confidence":
        return ConfidenceStop(config.num_draft_tokens, config.confidence_threshold)
    return FixedLength(config.num_draft_tokens)


class ChainBudget:
    """A lone sequence's chains (`decoding/round.Budget`): the policy's length, at most the room left;
    with `siblings` (a target that verifies trees, a lossless rule) the "cost" policy's sibling rule."""

    def __init__(self, policy: DraftPolicy, siblings: bool = False) -> None:
        self.policy = policy
        self.siblings = policy.sibling if siblings else None

    def request(self, rows: int, room: int) -> DraftRequest | None:
        k = min(self.policy.num_draft_tokens(), room)
        return DraftRequest.chain(k, self.policy.keep_drafting, self.siblings) if k >= 1 else None

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
