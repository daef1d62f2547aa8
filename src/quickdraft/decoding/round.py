"""The round, once: draft -> one target forward -> verify -> commit, for every running sequence.

Both speculative loops run this step: a lone request (`decoding/vanilla.py`) is a batch of one over
its target (`SoloTarget`, any runtime), and the batched decoder (`decoding/batch.py`) runs it over
every row of the batch cache (`runtime/caches/batched.BatchedTarget`). One round of `RoundLoop.step`:

1. draft: each lane asks its drafter for what the budget grants it (a chain of the draft-length
   policy's length, a tree of a shape, or a batch's per-size budget); nothing while the guard keeps
   rounds plain; draft ids outside the target's vocabulary end their branch (they cannot match);
2. forward: one target forward over every lane's [last committed token, draft nodes] (a chain
   causally, reusing Kangaroo's shallow states alone; a tree with depth positions and its mask);
3. verify: lossless, one greedy rule and one sampling rule over trees (a chain is a one-wide tree:
   `verifiers/tree.py`); drafts without q rows (suffix, n-gram) are sampled by following the
   target's own draws, made with each output position's noise (so a seeded request gives plain
   decoding's text); a chain under a named lossy rule (lenient, SpecDec's) is judged by it;
4. commit: the target keeps the root and the accepted path of each lane (a prefix: a rollback), the
   drafter gets the committed rows' states it reads, the budget and the guard learn the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from quickdraft.config import SamplingConfig
from quickdraft.decoding.ahead import Ahead, branches, deeper, guess, take_ahead
from quickdraft.decoding.common import Generators, StateHandoff
from quickdraft.decoding.guard import DraftGuard
from quickdraft.drafters.base import Drafter, DraftRequest
from quickdraft.runtime.caches.batched import RowBlock
from quickdraft.runtime.choose import eager_attention
from quickdraft.runtime.target import Target
from quickdraft.sampling import greedy as greedy_ids
from quickdraft.sampling import logits_to_probs
from quickdraft.types import Round, TargetOutput
from quickdraft.verifiers import Verifier
from quickdraft.verifiers.tree import TokenTree, follow_greedy, verify_tree_sampling


@dataclass
class Lane:
    """One sequence in the round loop.

    Attributes:
        context: the committed ids (prompt and generated); the target's cache holds all but the last.
        sampling: its sampling settings.
        gens: its random streams.
        drafter: its drafter (its own state and cache), or None: plain rounds.
        reads: the target layers its drafter observes after every round (empty: none).
        ahead: its next round's drafts, made while the last verify ran (`decoding/ahead.py`).
        twin: the fork of its drafter that makes them (its own state: the lane's drafter's is untouched).
    """

    context: list[int]
    sampling: SamplingConfig
    gens: Generators
    drafter: Drafter | None
    reads: tuple[int, ...]
    ahead: list[Ahead] = field(default_factory=list, kw_only=True)
    twin: Drafter | None = field(default=None, kw_only=True)


class Budget(Protocol):
    """What each lane may draft this round, and what it learns from the outcome."""

    def request(self, rows: int, room: int) -> DraftRequest | None:
        """The request of each of `rows` lanes with `room` tokens left (None: no draft)."""
        ...

    def observe(self, drafted: list[tuple[int, int]]) -> None:
        """One round's (nodes drafted, nodes accepted) of each lane that drafted."""
        ...


class RowsTarget(Protocol):
    """A target that runs one block of new rows per lane in one forward and keeps chosen rows."""

    vocab_size: int

    def run(self, blocks: Sequence[RowBlock]) -> list[TargetOutput]:
        """Every lane's block (in lane order) -> its rows' logits and the states its drafter reads."""
        ...

    def commit(self, row: int, keep: Sequence[int]) -> None:
        """Keep offsets `keep` (increasing; a prefix or a tree's root and path) of lane `row`'s block."""
        ...


class SoloTarget:
    """One lane over a `Target` (any runtime): a chain is a causal extend, rolled back to the
    accepted prefix; a tree is scored under its mask and compacted to the accepted path.

    Args:
        target: the target and its cache.
        handoff: the states the lane's drafter reads (asked of every forward).
    """

    def __init__(self, target: Target, handoff: StateHandoff) -> None:
        self.target, self.handoff, self.vocab_size = target, handoff, target.vocab_size
        self._base = 0  # the cache's length before the last forward

    def run(self, blocks: Sequence[RowBlock]) -> list[TargetOutput]:
        (block,) = blocks
        self._base = self.target.length
        if block.depths is None:  # a chain: causal, reusing the shallow states it carries
            reuse = {} if block.shallow is None else {"shallow": block.shallow}
            return [self.handoff.forward(self.target, block.tokens, **reuse)]
        positions = [self._base + d for d in block.depths]
        return [self.handoff.forward(self.target, block.tokens, positions=positions, tree_mask=block.mask)]

    def commit(self, row: int, keep: Sequence[int]) -> None:
        if is_prefix(keep):
            self.target.rollback(self._base + len(keep))
        else:
            self.target.compact(keep)


def is_prefix(keep: Sequence[int]) -> bool:
    """Whether `keep` is 0, 1, ..., n-1 (a chain's accepted rows)."""
    return all(k == i for i, k in enumerate(keep))


@dataclass
class RoundLoop:
    """The round step over any lanes (module docstring).

    Attributes:
        target: runs the lanes' blocks and keeps their accepted rows.
        budget: grants each lane its draft.
        verifier: a named lossy chain rule (lenient, SpecDec's); None or lossless: the tree rules.
        guard: drops to plain rounds while drafting loses (decoding/guard.py), or None.
        price: a drafted round's cost in plain-round steps (a batch prices its forward on the host's
            surface; None from it: the guard is not told); None: the guard's own pricing.
        label_rows: every round's events count the lanes it ran (`batch_rows`).
        ahead: draft each lane's next round while the verify runs, for its likeliest outcome
            (`decoding/ahead.py`; worth it where the forward runs without the host: a captured graph).
    """

    target: RowsTarget
    budget: Budget
    verifier: Verifier | None = None
    guard: DraftGuard | None = None
    price: Callable[[list[TokenTree]], float | None] | None = None
    label_rows: bool = False
    ahead: bool = False

    def step(self, lanes: Sequence[Lane], rooms: Sequence[int]) -> list[Round]:
        """One round over `lanes` (each with `rooms` tokens left before its limit); their Rounds."""
        start = time.perf_counter()
        plain = self.guard is not None and not self.guard.drafts()
        requests = [None if plain else self.budget.request(len(lanes), room) for room in rooms]
        with eager_attention():  # drafters run uncaptured (the target's forward may be a graph)
            taken = [
                take_ahead(lane.ahead, lane.context, request) for lane, request in zip(lanes, requests, strict=True)
            ]
            drafts = [
                self._draft(lane, request) if t is None else t
                for lane, request, t in zip(lanes, requests, taken, strict=True)
            ]
        mid = time.perf_counter()
        outs = self.target.run([block(lane, d, r) for lane, d, r in zip(lanes, drafts, requests, strict=True)])
        made = [self._draft_ahead(lane, d, r) for lane, d, r in zip(lanes, drafts, requests, strict=True)]
        best = self._argmax(lanes, outs)  # the verdict's read: the drafts ahead ran while the GPU worked
        rounds, drafted = [], []
        for i, (lane, draft, request, out) in enumerate(zip(lanes, drafts, requests, outs, strict=True)):
            path, nxt = self._verify(lane, draft, out, best[i])
            keep = [0] + [1 + j for j in path]
            self.target.commit(i, keep)
            if lane.reads:
                pick = slice(0, len(keep)) if is_prefix(keep) else torch.tensor(keep, device=out.logits.device)
                with eager_attention():
                    lane.drafter.observe(out.rows(lane.reads, pick))
            new = [draft.tokens[j] for j in path] + [nxt]
            lane.context += new
            if len(draft):
                drafted.append((len(draft), len(path)))
            rounds.append(self._round(draft, request, path, new, mid - start, time.perf_counter() - mid, len(lanes)))
            if self.ahead:
                rounds[-1].events.update({"ahead_drafts": made[i], "ahead_hits": int(taken[i] is not None)})
        self.budget.observe(drafted)
        if plain:
            for rnd in rounds:
                rnd.events["guard_plain_rounds"] = 1
        elif drafted and self._pauses(drafts, requests, sum(len(r.tokens) for r in rounds)):
            for rnd in rounds:
                rnd.events["guard_pauses"] = 1
        return rounds

    def _draft(self, lane: Lane, request: DraftRequest | None) -> TokenTree:
        if request is None or lane.drafter is None:
            return TokenTree()
        draft = lane.drafter.propose(lane.context, request, lane.sampling, lane.gens.draft)
        return draft.within_vocab(self.target.vocab_size)

    def _draft_ahead(self, lane: Lane, draft: TokenTree, request: DraftRequest | None) -> int:
        """Draft the lane's next round for its likeliest outcomes with its drafter's twin, if `ahead` is
        on and the drafter `drafts_ahead` (`decoding/ahead.py`); returns how many drafts it made."""
        lane.ahead = []
        drafter = lane.drafter
        if not self.ahead or request is None or not len(draft) or drafter is None or not drafter.drafts_ahead:
            return 0
        lane.twin = lane.twin or drafter.fork()
        if lane.twin is None:
            return 0
        with eager_attention():
            for path in branches(draft):
                context = guess(lane.context, draft, path)
                made = lane.twin.propose(context, deeper(request), lane.sampling, None)
                if len(made):
                    lane.ahead.append(Ahead(context, made.within_vocab(self.target.vocab_size)))
        return len(lane.ahead)

    def _argmax(self, lanes: Sequence[Lane], outs: list[TargetOutput]) -> list[list[int] | None]:
        """Each greedy lane's argmax per row, read from the device once for all of them."""
        greedy = [i for i, lane in enumerate(lanes) if lane.sampling.greedy]
        best: list[list[int] | None] = [None] * len(lanes)
        if not greedy:
            return best
        ids = greedy_ids(torch.cat([outs[i].logits for i in greedy])).tolist()
        at = 0
        for i in greedy:
            n = outs[i].logits.shape[0]
            best[i], at = ids[at : at + n], at + n
        return best

    def _verify(self, lane: Lane, draft: TokenTree, out: TargetOutput, best: list[int] | None) -> tuple[list[int], int]:
        """(accepted node path, next token)."""
        if self.verifier is not None and self.verifier.lossy:
            return chain_verdict(self.verifier, draft, out.logits, lane.sampling, lane.gens.target)
        if best is not None:
            return follow_greedy(draft, best)
        probs = logits_to_probs(out.logits, lane.sampling)  # (n + 1, V)
        if draft.q_rows:  # drafts sampled from a q: the rejection rule (maximal coupling)
            return verify_tree_sampling(draft, probs, lane.gens.target)
        # deterministic drafts (or none): each row's token is drawn with its output position's noise,
        # as plain decoding draws it; the accepted path follows the draws (`decoding/common.Generators`)
        return follow_greedy(draft, lane.gens.draws(probs, [len(lane.context) + d for d in (0, *draft.depths)]))

    def _round(self, draft, request, path, new, draft_s: float, verify_s: float, rows: int) -> Round:
        events = {"batch_rows": rows} if self.label_rows else {}
        depth = None
        if len(draft) and request is not None and request.shape is not None:  # a tree
            events.update({"tree_rounds": 1, "tree_nodes": len(draft), f"accepted_depth_{len(path)}": 1})
            depth = max(draft.depths)
        elif len(draft) and not draft.is_path():  # a chain with its second choices beside it
            chain = set(chain_nodes(draft))
            events.update({"sibling_nodes": len(draft) - len(chain), "sibling_hits": int(not chain.issuperset(path))})
            depth = len(chain)  # acceptance by position is by depth, as for a tree
        return Round(new, len(draft), len(path), draft_s, verify_s, events, depth)

    def _pauses(self, drafts: list[TokenTree], requests: list, committed: int) -> bool:
        """Tell the guard about a drafted round; True when its verdict pauses drafting. A chain's leaves
        beside it are verify rows, not draft forwards: it is priced as its chain over all its rows."""
        if self.guard is None:
            return False
        steps = None if self.price is None else self.price(drafts)
        if self.price is not None and steps is None:
            return False
        nodes = sum(len(d) for d in drafts)
        if steps is None and len(drafts) == 1 and requests[0] is not None and requests[0].shape is None:
            (draft,) = drafts
            if len(draft) and not draft.is_path():
                return self.guard.update(len(chain_nodes(draft)), committed, rows=nodes + 1)
        return self.guard.update(nodes, committed, steps=steps)


def chain_nodes(draft: TokenTree) -> list[int]:
    """A chain-with-siblings draft's chain: the path to its first deepest node (each position's chain
    token comes before the leaf beside it)."""
    depths = draft.depths
    return draft.path_to(depths.index(max(depths)))


def block(lane: Lane, draft: TokenTree, request: DraftRequest | None) -> RowBlock:
    """The lane's rows in the round's forward: a tree (asked for, or a chain with leaves beside it) with
    depth offsets and its mask, else a chain."""
    rows = [lane.context[-1], *draft.tokens]
    if len(draft) and request is not None and (request.shape is not None or not draft.is_path()):
        return RowBlock(rows, [0, *draft.depths], draft.mask())
    return RowBlock(rows, shallow=draft.shallow)


def chain_verdict(
    verifier: Verifier, draft: TokenTree, logits: torch.Tensor, sampling: SamplingConfig, generator
) -> tuple[list[int], int]:
    """A chain judged by a named rule: (accepted prefix, next token)."""
    p = (logits if verifier.reads_logits else logits_to_probs(logits, sampling)).unsqueeze(0)  # (1, k+1, V)
    q = draft.path_q()
    tokens = draft.tensor().unsqueeze(0).to(p.device)
    verdict = verifier(tokens, None if q is None else q.unsqueeze(0), p, generator)
    return list(range(int(verdict.num_accepted[0]))), int(verdict.next_tokens[0])
