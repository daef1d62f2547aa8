"""PEARL (Liu et al., arXiv 2408.11850): draft and target run at the same time, draft length adapts.

The algorithm is a small state machine (`PearlLogic`, `decoding/pearl_logic.py`) that knows nothing
of models or processes. Each round it names a draft job (continue a context by gamma tokens) and a
target job (feed some tokens, get rows of p); `judge` turns the target's rows into a verdict; `apply`
commits it. The
same logic drives `PearlDecoder` (both halves one after the other, in one process: the reference)
and the two-process runner in `quickdraft.decoding.pearl_parallel`.

Round kinds (notes section 1.2):
- ``pre``   draft gamma tokens from the committed text || target forward over the last committed
            token (1 row): pre-verify the first draft token; accept -> the rest becomes pending.
- ``post``  draft gamma new tokens after committed + pending || target forward over the last
            committed token + pending (len(pending) + 1 rows): verify pending + the first new draft.
            All accepted: no bonus token, keep going; a rejection drops everything after it.
- ``draft`` (pre-verify off) the draft alone drafts gamma tokens, which become pending.
- ``verify``(post-verify off) the target alone verifies pending, with a bonus token.
With both ablations off the rounds alternate draft/verify: exactly vanilla speculative decoding.

Every committed token passes the standard single-token speculative-sampling test against the exact
target distribution at its position, so the method is lossless.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.decoding.common import Generators, prefill_step
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.pearl_logic import PearlConfig, PearlLogic, PearlVerdict
from quickdraft.drafters.base import Drafter, DraftRequest
from quickdraft.runtime.target import Target
from quickdraft.sampling import logits_to_probs
from quickdraft.types import Round
from quickdraft.verifiers import Verifier

DEFAULT_GAMMA = 4  # for drafters with no model (prompt lookup): their steps cost ~nothing to measure


def gamma_from_costs(target_s: float, draft_s: float | None) -> int:
    """gamma = round(target step / draft step), in [1, 16] (nano-PEARL's auto_set_gamma at batch 1):
    drafting gamma tokens then takes as long as one target forward. draft_s None (a model-free
    drafter) gives DEFAULT_GAMMA."""
    if draft_s is None:
        return DEFAULT_GAMMA
    return max(1, min(16, round(target_s / max(draft_s, 1e-6))))


class PearlDecoder:
    """PEARL's driver loop (method "pearl"). In one process the two halves run one after the other
    (exact, not faster); the parallel runner (`pearl_parallel.py`) runs this same loop in its target
    worker with a drafter that receives the draft worker's tokens, so each round starts the target's
    forward before it asks for the drafts (which the other process drafts meanwhile).

    `last_verdict` is the verdict of the last yielded round (None for the first, prefill round)."""

    name = "pearl"

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        verifier: Verifier,
        config: PearlConfig,
        gamma: int,
        events: dict[str, int] | None = None,
        keep_drafting: Callable[[torch.Tensor, int], bool] | None = None,
    ) -> None:
        self.target, self.drafter, self.verifier, self.gamma = target, drafter, verifier, gamma
        self.config = config.resolved(parallel=False)  # as given; auto pre-verify is off in one process
        self.keep_drafting = keep_drafting  # (V,) draft logits -> whether to draft on (p-min: stop where unsure)
        self.events = dict(events or {})  # reported once with the first token (parallel declined)
        self.lossy = verifier.lossy
        self.last_verdict: PearlVerdict | None = None
        # one process only: plain rounds while drafting loses on this host's costs (decoding/guard.py);
        # a round costs its forward's rows on the curve plus its draft forwards, one after the other
        self.guard: DraftGuard | None = None

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        self.drafter.begin(prompt_ids, max_new_tokens)
        self.last_verdict = None
        first = prefill_step(self.target, prompt_ids, sampling, generators)
        first.events = dict(self.events)
        yield first
        logic = PearlLogic(
            list(prompt_ids) + first.tokens,
            self.gamma,
            self.config.pre_verify,
            self.config.post_verify,
            max_length=len(prompt_ids) + max_new_tokens,
        )
        draft_s = 0.0
        unpriced = 0  # tokens drafted in draft-only rounds: their cost joins the next verified round's
        if self.guard is not None:
            self.guard.reset()
        while True:
            # a guarded plain round, at a fresh start (nothing pending): the target's one row, no drafts
            fresh = logic.kind in ("pre", "draft") and not logic.pending
            plain = self.guard is not None and fresh and not self.guard.drafts()
            if plain:
                logic.plain_round()
            feed = logic.target_job()
            start = time.perf_counter()
            p = None if feed is None else logits_to_probs(self.target.extend(feed), sampling)  # (len(feed), V)
            verify_s = time.perf_counter() - start
            # paused with drafts pending: verify them (with a bonus token) and draft nothing new
            idle = plain or (self.guard is not None and logic.kind == "post" and self.guard.paused())
            drafted, drafted_q, draft_s = (
                ([], None, draft_s) if idle else self._draft(logic, sampling, generators, draft_s)
            )
            if p is None:  # draft-only round
                logic.apply(None, drafted, drafted_q)
                unpriced += len(drafted)
                continue
            start = time.perf_counter()
            verdict = logic.judge(drafted, drafted_q, p, self.verifier, generators)
            rnd = logic.apply(verdict, drafted, drafted_q)
            self.target.rollback(logic.target_cache_length)
            if plain:
                rnd.events = {**rnd.events, "guard_plain_rounds": 1}
            elif self.guard is not None and (drafted or unpriced):  # every drafted token priced once
                if self.guard.update(len(drafted) + unpriced, len(rnd.tokens), len(feed)):
                    rnd.events = {**rnd.events, "guard_pauses": 1}
                unpriced = 0
            rnd.draft_s, rnd.verify_s, draft_s = draft_s, verify_s + time.perf_counter() - start, 0.0
            self.last_verdict = verdict
            yield rnd

    def _draft(self, logic: PearlLogic, sampling, generators, draft_s: float):
        job = logic.draft_job()
        if job is None:
            return [], None, draft_s
        start = time.perf_counter()
        context, k = job
        if k == 0:
            return [], None, draft_s
        draft = self.drafter.propose(context, DraftRequest.chain(k, self.keep_drafting), sampling, generators.draft)
        return draft.tokens, draft.path_q(), draft_s + time.perf_counter() - start
