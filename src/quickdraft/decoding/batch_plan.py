"""How many draft nodes each row of a batch gets: read off the host's batched cost surface and
calibrated by what the rows accept (`BatchPlan`)."""

from __future__ import annotations

from collections.abc import Callable

from quickdraft.costs.batch_costs import covering_size, plan_budgets
from quickdraft.drafters.base import DraftRequest, KeepDrafting
from quickdraft.drafters.tree import TreeShape


class BatchPlan:
    """The draft budget per row by batch size, calibrated by what the rows accept.

    With a gain table (expected tokens per forward by budget: the suffix drafter's) and the host's
    batched cost surface, each batch size gets the budget maximising tokens per second
    (`models.batch_costs.plan_budgets`). The table was measured offline, so its extra tokens
    (gain - 1) are scaled by the ratio of the extra tokens the rows actually accept to what the
    table promised for the budgets they drafted with (a prior of `prior` rounds at the table's
    value), and the budgets are re-planned every `replan` rounds: where drafts are accepted less
    than the table says, speculation stops at a smaller batch. Without a gain table the budget is
    `fixed` at every size (0: no speculation).

    Args:
        surface: {(rows, width): relative cost} (costs/batch_costs.py); None with `fixed`.
        gain: the drafter's gain table, or None.
        fixed: the budget when there is no gain table.
        trees: drafts are trees of the budget (else chains of that length).
        tree_width: a tree's width.
        keep_drafting: a chain's early stop, asked after each draft token (a draft model's p-min: its
            chains of `fixed` end after a token it is unsure of, as a lone request's do), or None.
        draft_cost: draft nodes -> a row's drafting of them in one-row steps (`parts.draft_cost`), or None.
    """

    def __init__(
        self,
        surface: dict | None,
        gain: dict[int, float] | None = None,
        fixed: int = 0,
        trees: bool = True,
        tree_width: int = 8,
        prior: float = 32.0,
        replan: int = 8,
        keep_drafting: KeepDrafting | None = None,
        draft_cost: Callable[[int], float] | None = None,
    ) -> None:
        self.surface, self.gain, self.fixed = surface, dict(gain) if gain else None, fixed
        self.trees, self.tree_width, self.replan = trees, tree_width, replan
        self.keep_drafting, self.draft_cost = keep_drafting, draft_cost
        self.promised, self.accepted = prior, prior  # extra tokens: the table's, the rows'
        self._since = 0
        self.budgets = self._plan()

    @property
    def scale(self) -> float:
        """Accepted extra tokens over the table's promise, so far."""
        return self.accepted / self.promised

    @property
    def widest(self) -> int:
        """The most draft nodes a row can be granted, whatever the calibration: the gain table's
        largest budget, else `fixed` (what the static forward's warm-up captures for)."""
        return max(self.gain) if self.gain else self.fixed

    def _plan(self) -> dict[int, int]:
        """{measured batch size: budget}: `fixed` everywhere without a gain table."""
        if self.surface is None:
            return {1: self.fixed}
        if not self.gain:
            return plan_budgets(self.surface, None, self.fixed)
        gain = {k: 1.0 + (g - 1.0) * self.scale for k, g in self.gain.items()}
        return plan_budgets(self.surface, gain, drafting=self.draft_cost)

    def budget(self, rows: int) -> int:
        return self.budgets[covering_size(self.budgets, rows)]

    def request(self, rows: int, room: int) -> DraftRequest | None:
        """What each of `rows` rows asks its drafter for, with `room` tokens left (None: nothing)."""
        budget = min(self.budget(rows), room)
        if budget < 1:
            return None
        if self.trees:
            return DraftRequest.tree(TreeShape(budget, self.tree_width))
        return DraftRequest.chain(budget, self.keep_drafting)

    def observe(self, drafted: list[tuple[int, int]]) -> None:
        """One round's (budget asked, draft tokens accepted) of each row that drafted."""
        if not self.gain or not drafted:
            return
        for budget, accepted in drafted:
            key = min(self.gain, key=lambda k: abs(k - budget))
            self.promised += self.gain[key] - 1.0
            self.accepted += accepted
        self._since += 1
        if self._since >= self.replan:
            self._since = 0
            self.budgets = self._plan()
