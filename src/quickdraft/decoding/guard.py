"""Never slower than plain decoding: drop to plain rounds while drafting measurably loses, probe later.

A drafted round commits `accepted + 1` tokens at the cost of one forward over its rows (the host's
measured verify-cost curve, a one-row step = 1) plus drafting (a model drafter's forwards, in target
steps). Plain decoding commits 1 token per step. The guard keeps the last `window` drafted rounds'
tokens and costs; when their rate falls below 1 token per step, the next `pause` rounds draft nothing
(plain one-row rounds, no drafter call), then drafting resumes with a fresh window (a probe). A probe
that loses again doubles the pause (up to `max_pause`); a window that pays resets it. Every decision
reads counts and the curve, never a clock, so a seeded generation repeats exactly; a sampled
generation starts with a fresh guard, so it does not depend on the requests before it, while greedy
ones share one per engine and carry its verdict over while drafting has never paid on it (their tokens
are the same either way); once it has, each request starts afresh.

The statistics count `guard_plain_rounds` (rounds the guard kept plain) and `guard_pauses`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class DraftGuard:
    """Whether the next round drafts, from what drafting earned in the last rounds.

    Args:
        cost: (rows of the verify forward, nodes drafted) -> the round's cost in one-row target steps.
        window: drafted rounds judged together (the decision waits until the window is full).
        pause: plain rounds after drafting is first judged to lose, before the next probe.
        max_pause: the longest pause (each losing probe doubles it).
        carries: its verdict carries from one generation to the next (`reset` keeps it) until a
            window has paid: greedy generations, whose tokens do not depend on which rounds drafted,
            share one guard per engine, so a request does not start with a window of drafting at a
            loss where drafting never paid. Once one has, a loss is the text's, not the drafter's,
            and each request starts afresh (on Spec-Bench quick a pause carried from summarization
            and qa held the math-reasoning prompt plain: 1.60 tokens a forward against 5.33).
    """

    cost: Callable[[int, int], float]
    window: int = 8
    pause: int = 16
    max_pause: int = 128
    carries: bool = False
    _recent: deque = field(default_factory=deque)
    _plain_left: int = 0
    _losses: int = 0  # losing verdicts in a row
    _paid: bool = False  # a full window has paid (a carrying guard then starts each request afresh)

    def reset(self) -> None:
        """A new generation: drafting starts on, with an empty window (a guard that `carries` keeps
        its window, pause and backoff while no window has paid)."""
        if self.carries and not self._paid:
            return
        self._recent.clear()
        self._plain_left = 0
        self._losses = 0

    def drafts(self) -> bool:
        """Whether this round drafts (False: a plain round, counted down here)."""
        if self._plain_left > 0:
            self._plain_left -= 1
            return False
        return True

    def paused(self) -> bool:
        """Whether the next rounds are plain (a pause is running)."""
        return self._plain_left > 0

    def plain_left(self) -> int:
        return self._plain_left

    def take_plain(self, rounds: int) -> None:
        """Count `rounds` plain rounds run elsewhere (a lone row's chained steps) against the pause."""
        self._plain_left = max(0, self._plain_left - rounds)

    def update(self, drafted: int, committed: int, rows: int | None = None, steps: float | None = None) -> bool:
        """Record a drafted round (`drafted` nodes drafted, verified in one forward over `rows` rows:
        by default the last committed token and the nodes; `committed` tokens kept; `steps`: its cost
        when the caller priced it, as a batch prices its rounds); returns True when this round's
        verdict pauses drafting."""
        if steps is None:
            steps = self.cost(drafted + 1 if rows is None else rows, drafted)
        self._recent.append((committed, steps))
        if len(self._recent) > self.window:
            self._recent.popleft()
        if len(self._recent) < self.window:
            return False
        tokens = sum(t for t, _ in self._recent)
        steps = sum(c for _, c in self._recent)
        if tokens >= steps:  # at least plain decoding's 1 token per step
            self._losses = 0
            self._paid = True
            return False
        self._recent.clear()
        self._plain_left = min(self.max_pause, self.pause << self._losses)
        self._losses += 1
        return True
