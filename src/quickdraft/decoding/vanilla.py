"""Vanilla speculative decoding: draft -> verify -> commit -> roll back, one round at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from quickdraft.config import SamplingConfig
from quickdraft.decoding.adaptive import DraftPolicy
from quickdraft.decoding.common import Generators, StateHandoff, prefill_step
from quickdraft.drafters.base import Drafter, empty_proposal
from quickdraft.models.cached_model import CachedModel
from quickdraft.sampling import logits_to_probs
from quickdraft.types import Round
from quickdraft.verifiers import Verifier


class SpeculativeDecoder:
    """Draft with any Drafter, verify with any Verifier (method name "sd").

    Cache ownership: the target's CachedModel is driven here (extend k+1 rows, roll back to the
    committed length minus one); the drafter owns and syncs its own state. A drafter that reuses
    the target (drafters/base.py: feature head, Kangaroo) is bound to the target's cache owner and
    observes the states of every committed row; a proposal carrying shallow states (Kangaroo) is
    verified by the remaining layers only.

    Args:
        target: the target model and its cache.
        drafter: proposes tokens.
        verifier: accepts/rejects them (lossless unless verifier.lossy).
        make_policy: builds a fresh draft-length policy for each generation.
    """

    name = "sd"

    def __init__(
        self,
        target: CachedModel,
        drafter: Drafter,
        verifier: Verifier,
        make_policy: Callable[[], DraftPolicy],
        events: dict[str, int] | None = None,
    ) -> None:
        self.target, self.drafter, self.verifier, self.make_policy = target, drafter, verifier, make_policy
        self.events = dict(events or {})  # reported once with the first token (a tree that fell back)
        self.lossy = verifier.lossy
        self.handoff = StateHandoff.of(drafter, target)

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        """Yield one Round per target forward until the consumer stops."""
        policy = self.make_policy()
        self.drafter.begin(prompt_ids)
        first = prefill_step(self.target, prompt_ids, sampling, generators.target, self.handoff)
        first.events = dict(self.events)
        yield first
        context = list(prompt_ids) + first.tokens
        produced = 1
        while True:
            # Step 1: draft, leaving room for the correction/bonus token within the budget.
            k = min(policy.num_draft_tokens(), max_new_tokens - produced - 1)
            start = time.perf_counter()
            proposal = (
                self.drafter.propose(context, k, sampling, generators.draft, policy.keep_drafting)
                if k > 0
                else empty_proposal()
            )
            drafted = proposal.tokens.tolist()
            mid = time.perf_counter()
            # Step 2: one target forward over [last committed token, d_1..d_k] -> k+1 rows of p.
            reuse = {} if proposal.shallow is None else {"shallow": proposal.shallow}
            out = self.handoff.forward(self.target, [context[-1], *drafted], **reuse)
            logits = out.logits  # (k+1, V)
            raw = self.verifier.reads_logits  # Spec-Verification reads logit gaps
            p = (logits if raw else logits_to_probs(logits, sampling)).unsqueeze(0)  # (1, k+1, V)
            q = None if proposal.q_probs is None else proposal.q_probs.unsqueeze(0)
            verdict = self.verifier(proposal.tokens.unsqueeze(0), q, p, generators.target)
            n, next_token = int(verdict.num_accepted[0]), int(verdict.next_tokens[0])
            # Step 3: commit accepted drafts + next token; the target cache keeps all but the new token.
            new_tokens = drafted[:n] + [next_token]
            self.target.rollback(len(context) + n)
            self.handoff.hand_over(out, n + 1)  # the committed rows, passed to the drafter
            context += new_tokens
            produced += len(new_tokens)
            policy.update(len(drafted), n)
            yield Round(new_tokens, len(drafted), n, draft_s=mid - start, verify_s=time.perf_counter() - mid)
