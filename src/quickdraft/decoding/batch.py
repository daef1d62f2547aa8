"""Continuous batching with speculation per row: many sequences share each target forward.

`BatchDecoder.step()` is one round of the whole batch:
1. admit: waiting sequences are prefilled alone, in chunks of at most `prefill_chunk` tokens per
   round, others running or not (so a long prompt never stalls them, or its own cancellation, for
   more than one chunk), keeping
   the prefix a prompt shares with the previous one (a chat template's system prompt), and join
   the batch (a new row of the target's batch cache) with their first token;
2. draft: every row asks its own drafter (a fork of the configured one: the same data and weights,
   its own state and cache) for a tree of the round's budget, or a chain; the budget depends on
   how many rows run (`BatchPlan`: on a host where a wider forward stops being nearly free,
   speculation shrinks and then stops as the batch grows);
3. verify: one batched forward over every row's [last committed token, draft nodes], padded to a
   common width, each row against its own context; each row is verified alone by the lossless
   tree rules with its own sampling settings and random streams, and keeps its accepted path; a
   drafter that reads the target's features (the head, SpecDec) gets its row's committed ones;
4. leave: rows that ended (EOS, stop strings, max tokens: their own `Collector`) or were cancelled
   leave the batch at the round boundary.

Steps 2 and 3 are the round loop's step (`decoding/round.py`), the one a lone request runs as a
batch of one (`decoding/vanilla.py`), so every row's output is what the same request gives alone:
equal tokens when greedy (tested in float64), the target's law when sampled (a chain is a one-wide
tree; a model drafter's tree carries the q rows its tokens were drawn from).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.costs.batch_costs import surface_cost
from quickdraft.decoding.batch_plan import BatchPlan
from quickdraft.decoding.collect import Collector
from quickdraft.decoding.common import Generators, pick_token
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.lone_chain import LoneChain
from quickdraft.decoding.round import Lane, RoundLoop
from quickdraft.drafters.base import FEATURES, Drafter
from quickdraft.runtime.caches.batched import BatchedTarget
from quickdraft.runtime.choose import eager_attention
from quickdraft.runtime.kernels.attention import invariant_prefill
from quickdraft.types import Round
from quickdraft.verifiers.tree import TokenTree


@dataclass
class BatchUpdate:
    """What one round gave one sequence: the tokens it kept (none when it was just admitted with
    a prefill still running) and its collector (`done` once it ended)."""

    key: Hashable
    tokens: list[int]
    collector: Collector


@dataclass
class _Waiting:
    key: Hashable
    prompt: list[int]
    sampling: SamplingConfig
    stop: StopConfig
    done: int = 0  # prompt tokens prefilled so far
    cached: int = 0  # of which kept from an earlier prompt or conversation (no forward)
    started: bool = False  # its prefill has begun in the prefill cache
    prefill_s: float = 0.0


@dataclass
class _Row(Lane):
    """A running sequence: its lane in the round loop, its key and its collector."""

    key: Hashable
    collector: Collector
    aligned: int = 0  # its prompt's positions prefilled in whole pieces (`prefix_store.reusable`)


class BatchDecoder:
    """Sequences decoded together over one `BatchedTarget` (module docstring).

    Args:
        target: the batched target (its max_batch bounds the running rows).
        drafter: the configured drafter (each row drafts with `drafter.fork()`); None: no drafts.
        plan: the draft budget by batch size.
        detokenize: ids -> text, for stop strings and text.
        prefill_chunk: prompt tokens prefilled per round while other rows run.
    """

    def __init__(
        self,
        target: BatchedTarget,
        drafter: Drafter | None,
        plan: BatchPlan,
        detokenize: Callable[[list[int]], str] | None = None,
        prefill_chunk: int = 128,
    ) -> None:
        probe = drafter.fork() if drafter is not None else None
        if drafter is not None and probe is None:
            raise ValueError(f"drafter {drafter.name!r} cannot draft for several rows at once")
        reads = set(probe.target_layers) if probe is not None else set()
        if reads - {FEATURES}:
            raise ValueError(f"drafter {drafter.name!r} reads target layers {sorted(reads)}; a batch hands features")
        self.reads_features = FEATURES in reads  # each row's fork observes its committed rows' features
        target.keep_features = self.reads_features
        self.target, self.drafter, self.plan = target, drafter, plan
        self.detokenize, self.prefill_chunk = detokenize, max(1, prefill_chunk)
        self.waiting: deque[_Waiting] = deque()
        self.rows: list[_Row] = []  # in the target's row order
        self.rounds = 0
        self.ran: dict[str, str] = {}  # what runs, copied into every row's statistics (Engine sets it)
        # the draft guard over the whole batch (Engine sets it): nodes drafted by a row -> its drafting
        # cost in one-row target steps, and the guard that drops to plain rounds while drafting loses
        self.draft_cost: Callable[[int], float] | None = None
        self.guard: DraftGuard | None = None
        self.lone = LoneChain()  # a lone greedy row's chained plain steps and their clock

    @property
    def idle(self) -> bool:
        return not self.rows and not self.waiting

    def submit(self, key: Hashable, prompt_ids: Sequence[int], sampling: SamplingConfig, stop: StopConfig) -> None:
        """Queue a sequence; it joins the batch once a row is free and its prompt is prefilled."""
        if not prompt_ids:
            raise ValueError("submit: an empty prompt")
        if len(prompt_ids) + stop.max_new_tokens > self.target.max_length:
            raise ValueError(f"prompt + max_new_tokens exceed the context of {self.target.max_length}")
        self.waiting.append(_Waiting(key, list(prompt_ids), sampling, stop))

    def cancel(self, key: Hashable) -> bool:
        """Drop a waiting or running sequence (at once: between rounds); False if unknown."""
        for job in self.waiting:
            if job.key == key:
                self.waiting.remove(job)
                return True
        for i, row in enumerate(self.rows):
            if row.key == key:
                self._leave(i)
                return True
        return False

    def abort(self) -> list[Hashable]:
        """Drop every waiting and running sequence (after a failure); returns their keys."""
        keys = [job.key for job in self.waiting] + [row.key for row in self.rows]
        for row in self.rows:
            if row.drafter is not None:
                row.drafter.end()
        self.waiting.clear()
        self.rows.clear()
        self.target.clear()
        return keys

    def step(self) -> list[BatchUpdate]:
        """Admit what fits, then one draft/verify round over every running row."""
        updates = self._admit()
        self._prune()
        if self.rows:
            lone = self._lone() and self.lone.chains(self.target.static, self.drafter, self.guard, self.rows[0])
            updates += self._chain() if lone else self._round()
            self._prune()
        self.rounds += 1
        return updates

    def _prune(self) -> None:
        for i in reversed(range(len(self.rows))):
            if self.rows[i].collector.done:
                self._leave(i)

    def _admit(self) -> list[BatchUpdate]:
        """Prefill from the head of the queue: at most `prefill_chunk` prompt tokens a step, with rows
        running or none (a 1.5B prefills 128 tokens in about 2 s on a 2-core AVX2 host), so a step never
        runs long: the caller can cancel a long prompt, or admit another request, between chunks (the
        server's loop does). A prompt is prefilled in pieces ending at multiples of `prefill_chunk`
        (`piece`), with row-invariant attention (`invariant_prefill`): its rows' bits never depend on
        what else the step prefills, nor on the prefix it took from an earlier request."""
        updates: list[BatchUpdate] = []
        budget, chunk = self.prefill_chunk, self.prefill_chunk
        while self.waiting and len(self.rows) < self.target.max_batch and budget > 0:
            job = self.waiting[0]
            start = time.perf_counter()
            if not job.started:  # a prefix shared with the previous prompt is kept, not recomputed
                job.done = job.cached = self.target.prefill_start(job.prompt, chunk)
                job.started = True
            size = piece(job.done, len(job.prompt), chunk)
            if size > budget:  # the rest of this step's budget: the piece waits for the next step
                break
            with eager_attention(), invariant_prefill():
                logits = self.target.prefill(job.prompt[job.done : job.done + size])
            job.done += size
            job.prefill_s += time.perf_counter() - start
            budget -= size
            if job.done == len(job.prompt):
                self.waiting.popleft()
                updates.append(self._join(job, logits[-1]))
        return updates

    def _join(self, job: _Waiting, logits) -> BatchUpdate:
        gens = Generators.from_seed(job.sampling.seed, self.target.net.device)
        token = pick_token(logits, job.sampling, gens, len(job.prompt))
        self.target.adopt()
        drafter = self.drafter.fork() if self.drafter is not None else None
        if drafter is not None:
            with eager_attention():
                drafter.begin(job.prompt, job.stop.max_new_tokens)
                if self.reads_features:
                    drafter.observe({FEATURES: self.target.prefill_features()})
        collector = Collector(job.stop, self.detokenize)
        collector.stats.verifier = "tree" if drafter is not None else ""
        collector.stats.ran = dict(self.ran)
        collector.stats.cached_prompt_tokens = job.cached
        reads = (FEATURES,) if self.reads_features else ()
        row = _Row(job.prompt + [token], job.sampling, gens, drafter, reads, job.key, collector)
        row.aligned = len(job.prompt) // self.prefill_chunk * self.prefill_chunk
        collector.held = lambda: self.target.row_bytes(len(row.context) - 1) + (drafter.kv_bytes() if drafter else 0)
        self.rows.append(row)
        kept = collector.feed(Round([token], verify_s=job.prefill_s))
        return BatchUpdate(job.key, kept, collector)

    def _round(self) -> list[BatchUpdate]:
        """One round of the round loop (`decoding/round.py`) over every running row."""
        static = self.target.static
        ahead = static is not None and static.graphs and os.environ.get("QUICKDRAFT_AHEAD") != "0"
        loop = RoundLoop(self.target, self.plan, guard=self.guard, price=self._price, label_rows=True, ahead=ahead)
        if static is not None:
            self.lone.begin_round(static)
        rooms = [row.collector.stop.max_new_tokens - len(row.collector.tokens) - 1 for row in self.rows]
        rounds = loop.step(self.rows, rooms)
        return [
            BatchUpdate(row.key, row.collector.feed(rnd), row.collector)
            for row, rnd in zip(self.rows, rounds, strict=True)
        ]

    def _lone(self) -> bool:
        """A lone greedy row on the static forward (`decoding/lone_chain.py`)."""
        return self.target.static is not None and self.target.max_batch == 1 and not self.waiting

    def _chain(self) -> list[BatchUpdate]:
        row = self.rows[0]
        kept = self.lone.run(self.target.static, row, row.collector, self.guard, self.drafter is not None)
        return [BatchUpdate(row.key, kept, row.collector)]

    def _price(self, drafts: list[TokenTree]) -> float | None:
        """A drafted round's cost for the guard, in steps of a plain round of the same rows (a plain
        batch commits one token per row per such step): its batched forward (the host's surface at
        its rows and widest block) plus every row's drafting. None without a surface or draft cost. A
        lone greedy row whose chained plain step was measured is priced by the clock instead."""
        if self._lone() and self.lone.clocked(self.rows[0]):
            return self.lone.price(self.target.static)
        surface = self.plan.surface
        if self.draft_cost is None or surface is None:
            return None
        rows, width = len(drafts), 1 + max(len(d) for d in drafts)
        cost = surface_cost(surface, rows, width) + sum(self.draft_cost(len(d)) for d in drafts)
        return rows * cost / surface_cost(surface, rows, 1)

    def _leave(self, i: int) -> None:
        """Row i leaves; the last row takes its place (as in the target's cache)."""
        row = self.rows[i]
        if row.drafter is not None:
            row.drafter.end()
        self.target.keep(i, row.context, row.aligned)
        self.target.remove(i)
        self.rows[i] = self.rows[-1]
        self.rows.pop()


def piece(done: int, length: int, chunk: int) -> int:
    """The next prefill piece of a prompt of `length` tokens with `done` prefilled: up to the next
    multiple of `chunk`, so every prompt's pieces are the same whatever it took from others."""
    return min(length - done, chunk - done % chunk)


def run_batch(decoder: BatchDecoder, jobs: Sequence[tuple[Sequence[int], SamplingConfig, StopConfig]]) -> list:
    """Run `jobs` (prompt ids, sampling, stop) to the end as one batch; their collectors in order."""
    for i, (ids, sampling, stop) in enumerate(jobs):
        decoder.submit(i, ids, sampling, stop)
    collectors: dict[int, Collector] = {}
    while not decoder.idle:
        for update in decoder.step():
            collectors[update.key] = update.collector
    return [collectors[i] for i in range(len(jobs))]
