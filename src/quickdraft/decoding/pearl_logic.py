"""The PEARL state machine (`PearlLogic`: no models, no processes, no clocks), its configuration and
verdict, and the q-row helpers it judges with. `decoding/pearl.py` drives it in one process,
`decoding/pearl_parallel.py` in two; the round kinds are described there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from quickdraft.decoding.common import Generators
from quickdraft.errors import QuickdraftError
from quickdraft.types import Round
from quickdraft.verifiers import Verifier
from quickdraft.verifiers.tree import TokenTree, follow_greedy


@dataclass(frozen=True)
class PearlConfig:
    """gamma: the window (draft tokens per round); None = chosen from measured forward costs.
    pre_verify / post_verify: the paper's two mechanisms (turn one off for its ablation). pre_verify
    None = on in two processes, off in one: a pre-verify round spends a target forward to commit one
    token, which pays only while the draft runs beside it (Spec-Bench quick, the Qwen pair, one
    process: slower with it than without; docs/benchmarks.md).
    parallel: run draft and target in two worker processes (else both halves in this process)."""

    gamma: int | None = None
    pre_verify: bool | None = None
    post_verify: bool = True
    parallel: bool = False

    def __post_init__(self) -> None:
        if self.gamma is not None and (not isinstance(self.gamma, int) or self.gamma < 1):
            raise QuickdraftError(f"PEARL gamma must be an integer >= 1 (or auto), got {self.gamma!r}")

    def resolved(self, parallel: bool) -> PearlConfig:
        """The same configuration with pre-verify decided: as given, else on only in two processes."""
        return replace(self, pre_verify=parallel if self.pre_verify is None else self.pre_verify)


@dataclass
class PearlVerdict:
    """What the target side decided: accepted count and the correction/bonus token (-1 = none)."""

    num_accepted: int
    next_token: int


def q_row_list(tokens: Sequence[int], q_probs: torch.Tensor | None) -> list[torch.Tensor | None]:
    """One entry per token: its (V,) q row, or None for a deterministic proposal (q_probs None)."""
    if q_probs is None:
        return [None] * len(tokens)
    if q_probs.shape[0] != len(tokens):
        raise QuickdraftError(f"{q_probs.shape[0]} q rows for {len(tokens)} draft tokens")
    return list(q_probs)


def stack_q_rows(tokens: Sequence[int], rows: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """(m, V) q rows for m judged tokens, or None when every token is deterministic.

    A deterministic token among sampled ones gets a one-hot row on itself, which the verifiers treat
    exactly as q None (accept with p(x); on rejection correct from norm(max(0, p - one_hot(x))))."""
    if len(rows) != len(tokens):
        raise QuickdraftError(f"{len(rows)} q rows for {len(tokens)} draft tokens")
    sampled = [row for row in rows if row is not None]
    if not sampled:
        return None
    like = sampled[0]
    out = []
    for token, row in zip(tokens, rows, strict=True):
        if row is None:
            row = torch.zeros_like(like)
            row[token] = 1.0
        out.append(row)
    return torch.stack(out)


class PearlLogic:
    """The PEARL state machine for one sequence (no models, no processes, no clocks)."""

    def __init__(
        self,
        committed: Sequence[int],
        gamma: int,
        pre_verify: bool = True,
        post_verify: bool = True,
        max_length: int | None = None,
    ):
        self.committed = list(committed)
        self.max_length = max_length  # committed length at which generation ends (drafts stop there)
        self.pending: list[int] = []
        self.pending_q: list[torch.Tensor | None] = []  # one q row per pending token (None: deterministic)
        self.gamma, self.pre_verify, self.post_verify = gamma, pre_verify, post_verify
        self.kind = self._start_kind
        self.current_run = 0  # tokens committed since the last rejection (PEARL's own MAT)

    @property
    def _start_kind(self) -> str:
        return "pre" if self.pre_verify else "draft"

    def plain_round(self) -> None:
        """Make this round a plain step (the draft guard's): the target reads the last committed
        token, nothing is drafted, and the next round starts afresh at the first kind."""
        if self.pending or self.kind not in ("pre", "draft"):
            raise QuickdraftError(f"a plain round needs a fresh start, not a {self.kind!r} round with pending drafts")
        self.kind = "pre"

    def draft_job(self) -> tuple[list[int], int] | None:
        """(context, k) for the draft this round, or None when the draft idles. k is gamma, cut so
        that nothing is drafted past the end (a draft-only round leaves room for the bonus token)."""
        if self.kind == "verify":
            return None
        context = self.committed + self.pending
        k = self.gamma
        if self.max_length is not None:
            k = min(k, self.max_length - len(context) - (1 if self.kind == "draft" else 0))
        return context, max(0, k)

    def target_job(self) -> list[int] | None:
        """Tokens the target feeds this round (its cache holds committed[:-1]), or None."""
        if self.kind == "draft":
            return None
        return [self.committed[-1]] + ([] if self.kind == "pre" else self.pending)

    def candidates(self, drafted: list[int], drafted_q: torch.Tensor | None):
        """Tokens judged this round, their (m, V) q rows (None if all deterministic) and whether the
        target's last row is free for a bonus token (verify rounds, or a round whose draft is empty).

        Pending tokens and this round's draft may come from different stages of a fallback chain
        (a sampled model draft, then a deterministic n-gram copy, or the reverse): each token keeps
        its own q row, and a deterministic token's row is one-hot (`stack_q_rows`)."""
        if self.kind == "pre" and not drafted:
            return [], None, True  # nothing drafted: a plain decoding step
        if self.kind == "verify" or (self.kind == "post" and not drafted):
            return list(self.pending), stack_q_rows(self.pending, self.pending_q), True
        if self.kind == "pre":
            return drafted[:1], stack_q_rows(drafted[:1], q_row_list(drafted, drafted_q)[:1]), False
        if self.kind == "post":
            cand = self.pending + drafted[:1]
            return cand, stack_q_rows(cand, self.pending_q + q_row_list(drafted, drafted_q)[:1]), False
        raise QuickdraftError(f"nothing to judge in a {self.kind!r} round")

    def judge(
        self,
        drafted: list[int],
        drafted_q: torch.Tensor | None,
        p_rows: torch.Tensor,
        verifier: Verifier,
        gens: Generators,
    ) -> PearlVerdict:
        """Run the verifier on this round's candidates; deterministic ones under a lossless verifier
        follow the target's own draws at their positions (`Generators.noise`: plain decoding's text).

        Args:
            drafted: this round's new draft tokens (empty in a verify round).
            drafted_q: (len(drafted), V) their q rows, or None for deterministic drafts.
            p_rows: (len(target_job()), V) processed target probabilities from the target's forward.
        """
        cand, q, bonus = self.candidates(drafted, drafted_q)
        m = len(cand)
        if p_rows.shape[0] != m + (1 if bonus else 0):
            raise QuickdraftError(f"PEARL {self.kind} round: {p_rows.shape[0]} rows of p for {m} candidates")
        if q is None and not verifier.lossy and not verifier.reads_logits:
            # deterministic under a lossless rule: the chain is a one-wide tree whose path follows the
            # target's own draws, as a speculative round's does (`decoding/round.py`)
            start = len(self.committed)
            best = gens.draws(p_rows, range(start, start + p_rows.shape[0])) + ([] if bonus else [-1])
            path, token = follow_greedy(TokenTree.path(cand), best)
            return PearlVerdict(len(path), token if (len(path) < m or bonus) else -1)
        # sampled drafts or a named rule: the verifier judges the chain (each through verifiers/tree.py)
        rows = p_rows if bonus else torch.cat([p_rows, p_rows[-1:]])  # a dummy bonus row, never used
        tokens = torch.tensor([cand], dtype=torch.long)
        verdict = verifier(tokens, None if q is None else q.unsqueeze(0), rows.unsqueeze(0), gens.target)
        n, token = int(verdict.num_accepted[0]), int(verdict.next_tokens[0])
        return PearlVerdict(n, token if (n < m or bonus) else -1)

    def apply(self, verdict: PearlVerdict | None, drafted: list[int], drafted_q: torch.Tensor | None) -> Round | None:
        """Commit a round's outcome; returns its Round (None for a draft-only round)."""
        q_rows = q_row_list(drafted, drafted_q)
        if self.kind == "draft":
            self.pending, self.pending_q = list(drafted), q_rows
            self.kind = "post" if self.post_verify else "verify"
            return None
        assert verdict is not None
        cand, _, _ = self.candidates(drafted, drafted_q)
        n, m = verdict.num_accepted, len(cand)
        new = cand[:n] + ([verdict.next_token] if verdict.next_token >= 0 else [])
        self.committed += new
        self.current_run += len(new)
        events: dict[str, int] = {}
        if self.kind in ("pre", "post") and n == m and drafted:  # all accepted: the rest of the new draft is pending
            self.pending = list(drafted[1:])
            self.pending_q = q_rows[1:]
            self.kind = "post" if self.post_verify else ("verify" if self.pending else self._start_kind)
        else:  # a rejection, or a round that drafted nothing (its bonus token ends it): start afresh
            if n < m:  # a rejection ends PEARL's run of accepted tokens (correction token included)
                events = {"pearl_runs": 1, "pearl_run_tokens": self.current_run}
                self.current_run = 0
            self.pending, self.pending_q = [], []
            self.kind = self._start_kind
        return Round(new, num_draft_tokens=m, num_accepted=n, events=events)

    @property
    def target_cache_length(self) -> int:
        """What the target cache must hold after a round: the committed text minus its last token."""
        return len(self.committed) - 1
