"""A lone greedy request on the static (graphed) forward: plain steps fed on the device, and drafting
priced against them by the clock.

On a GPU a plain step of a batch of one is one captured graph whose argmax feeds the next step on
the device (`StaticBatchForward.greedy_chain`): the host's launch and Python overlap the GPU's work,
so a plain step costs what the GPU does. A drafted round cannot overlap that way (its draft needs
the verdict of the round before), so it costs its host work on top (measured on a GPU, issue #50: a
suffix round cost more chained plain steps than the tokens it committed; docs/benchmarks.md). The
host's forward-cost curve does not see this (it times forwards, not rounds), so for this case the
guard is priced by the clock: a drafted round costs its wall time over a chained step's. Greedy
tokens do not depend on which rounds drafted, so the clock changes the speed, never the output.

`LoneChain` decides, for the one running row:
- no drafter: every step chains (`CHAIN_TOKENS` at a time, then the round boundary, so a cancel or
  a joining request waits no longer);
- a drafter that reads nothing of the target (suffix, n-gram, a model drafter's own tokens): the
  first `PROBE` tokens chain (the step's time, measured), and later while the guard keeps rounds plain;
- a drafter that reads the target's features (the head): never (its features come with rounds).
QUICKDRAFT_CHAIN=0 switches chaining off (a comparison).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

from quickdraft.decoding.guard import DraftGuard
from quickdraft.types import Round

CHAIN_TOKENS = 32  # plain greedy steps a decoder step runs chained (its round boundary)
PROBE = 8  # chained tokens that measure the plain step before a drafter's first round


@dataclass
class LoneChain:
    """The chained plain steps of a lone greedy row and the clock they give the guard.

    Attributes:
        step_s: a chained plain step's seconds (the median gap between tokens read; None: not yet).
        round_start: when the drafted round in flight began (`price` reads it).
        captures: the static forward's graph count when that round began (a capture is not priced).
    """

    step_s: float | None = None
    round_start: float = 0.0
    captures: int = 0
    _gaps: list[float] = field(default_factory=list)

    def chains(self, static, drafter, guard: DraftGuard | None, lane) -> bool:
        """Whether the lone `lane` runs chained plain steps now."""
        if static is None or os.environ.get("QUICKDRAFT_CHAIN") == "0" or not lane.sampling.greedy:
            return False
        if drafter is None:
            return True
        if lane.reads or guard is None:
            return False
        return self.step_s is None or guard.paused()

    def run(self, static, lane, collector, guard: DraftGuard | None, drafting: bool) -> list[int]:
        """Chain the lane's plain steps (up to CHAIN_TOKENS; with a drafter, the probe's or the guard's
        plain rounds left), feeding each token to `collector` as a one-token round; returns the kept."""
        room = collector.stop.max_new_tokens - len(collector.tokens)
        limit = min(room, CHAIN_TOKENS)
        if drafting:
            limit = min(limit, PROBE if self.step_s is None else guard.plain_left())
        kept: list[int] = []
        clock = [time.perf_counter()]
        gaps: list[float] = []
        events = {"guard_plain_rounds": 1} if drafting and self.step_s is not None else {}

        def take(token: int) -> bool:
            now = time.perf_counter()
            gaps.append(now - clock[0])
            kept.extend(collector.feed(Round([token], verify_s=now - clock[0], events=dict(events))))
            lane.context.append(token)
            clock[0] = now
            return not collector.done

        captured = len(static.chains)
        _, taken = static.greedy_chain(lane.context[-1], max(1, limit), take)
        if drafting and self.step_s is not None:
            guard.take_plain(taken)
        if len(static.chains) == captured and len(gaps) > 2:  # no capture inside: a clean measure
            self._gaps = (self._gaps + gaps[2:])[-64:]
            self.step_s = statistics.median(self._gaps)
        return kept

    def clocked(self, lane) -> bool:
        """Whether `lane`'s drafted rounds are priced by the clock: a greedy lane whose drafter reads
        nothing of the target (the ones that chain), once a chained step was measured."""
        return lane.sampling.greedy and not lane.reads and self.step_s is not None

    def begin_round(self, static) -> None:
        self.round_start, self.captures = time.perf_counter(), len(static.captured)

    def price(self, static) -> float | None:
        """The drafted round in flight in chained plain steps, by the clock (None: no step measured yet,
        or the round captured a graph, whose one-time cost is not the round's)."""
        if self.step_s is None or len(static.captured) != self.captures:
            return None
        return (time.perf_counter() - self.round_start) / self.step_s
