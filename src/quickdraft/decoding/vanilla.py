"""Speculative decoding, chains and trees in one round loop: draft -> one target forward -> verify ->
commit, one round at a time (method "sd").

A chain is a tree one node wide: every round's draft is a `TokenTree` (a chain drafter's proposal
becomes a path), the target scores it in one forward, and the accepted path is kept. What differs is
only how a round is asked for and checked:
- a chain (`shape` None) is asked for with the draft-length policy, scored by a plain causal
  extend (every runtime), verified by the configured verifier (lossless or lossy) and
  committed by rolling the target's cache back to the accepted length;
- a tree (`shape`: its node budget) is asked for by its shape, scored with depth positions and the
  tree's attention mask (native runtime), verified by the lossless tree rules and committed by
  compacting the cache to the root and the accepted path.

Cache ownership: the target's cache owner is driven here; the drafter owns and syncs its own state.
A drafter that reads the target's states gets the committed rows as an argument after every forward
(`decoding/common.StateHandoff`); a proposal carrying shallow states (Kangaroo) is verified by the
remaining layers only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from quickdraft.config import SamplingConfig
from quickdraft.decoding.adaptive import DraftPolicy
from quickdraft.decoding.common import Generators, StateHandoff, prefill_step
from quickdraft.decoding.guard import DraftGuard
from quickdraft.drafters.base import Drafter, DraftRequest
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.target import Target
from quickdraft.sampling import logits_to_probs
from quickdraft.types import Round, TargetOutput
from quickdraft.verifiers import Verifier
from quickdraft.verifiers.tree import TokenTree, verify_tree_greedy, verify_tree_sampling


class SpeculativeDecoder:
    """Draft with any Drafter, verify with any Verifier, chains or trees (method name "sd").

    Args:
        target: the target model and its cache (trees: the native runtime).
        drafter: drafts a path each round, or with `shape` a tree (`propose` with a `DraftRequest`).
        verifier: accepts/rejects a chain (lossless unless verifier.lossy); trees use the tree rules.
        make_policy: builds a fresh draft-length policy for each generation (chains).
        events: reported once with the first token (a tree that fell back, an auto-sized budget).
        shape: a tree's budget and shape; None drafts chains.
    """

    name = "sd"

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        verifier: Verifier,
        make_policy: Callable[[], DraftPolicy] | None,
        events: dict[str, int] | None = None,
        shape: TreeShape | None = None,
    ) -> None:
        if shape is not None and not target.supports_trees:
            raise QuickdraftError("token trees need the native runtime for the target (--runtime auto|native)")
        if shape is not None and not drafter.drafts_trees:
            raise QuickdraftError(f"drafter {drafter.name!r} cannot draft trees")
        self.target, self.drafter, self.verifier, self.make_policy = target, drafter, verifier, make_policy
        self.shape = shape
        self.events = dict(events or {})
        self.lossy = verifier.lossy
        self.handoff = StateHandoff.of(drafter, target)
        self.guard: DraftGuard | None = None  # drops to plain rounds while drafting loses (auto trees)

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        """Yield one Round per target forward until the consumer stops."""
        policy = self.make_policy() if self.shape is None else None
        self.drafter.begin(prompt_ids)
        first = prefill_step(self.target, prompt_ids, sampling, generators.target, self.handoff)
        first.events = dict(self.events)
        yield first
        context = list(prompt_ids) + first.tokens
        produced = 1
        if self.guard is not None:
            self.guard.reset()
        while True:
            room = max_new_tokens - produced - 1  # leave room for the correction/bonus token
            start = time.perf_counter()
            plain = self.guard is not None and not self.guard.drafts()
            draft = TokenTree() if plain else self._draft(context, room, policy, sampling, generators)
            mid = time.perf_counter()
            out = self._forward(context[-1], draft)  # one target forward over [last committed, draft]
            path, next_token = self._verify(draft, out, sampling, generators)
            self._commit(len(context), draft, path, out)
            new_tokens = [draft.tokens[i] for i in path] + [next_token]
            context += new_tokens
            produced += len(new_tokens)
            if policy is not None and not plain:
                policy.update(len(draft), len(path))
            rnd = self._round(draft, path, new_tokens, mid - start, time.perf_counter() - mid)
            if plain:
                rnd.events["guard_plain_rounds"] = 1
            elif self.guard is not None and len(draft) and self.guard.update(len(draft), len(new_tokens)):
                rnd.events["guard_pauses"] = 1
            yield rnd

    def _draft(
        self, context: list[int], room: int, policy: DraftPolicy | None, sampling: SamplingConfig, gens: Generators
    ) -> TokenTree:
        """The round's draft: a path of at most the policy's length, or a tree of at most the budget."""
        if self.shape is None:
            k = min(policy.num_draft_tokens(), room)
            if k < 1:
                return TokenTree()
            return self.drafter.propose(context, DraftRequest.chain(k, policy.keep_drafting), sampling, gens.draft)
        request = DraftRequest.tree(self.shape).within(room)
        return self.drafter.propose(context, request, sampling, gens.draft) if request.budget >= 1 else TokenTree()

    def _forward(self, last: int, draft: TokenTree) -> TargetOutput:
        """The target over [last committed token, draft nodes]: causal for a chain (reusing its
        shallow states when it carries them), depth positions and the tree mask for a tree."""
        rows = [last, *draft.tokens]
        if self.shape is None or not len(draft):
            reuse = {} if draft.shallow is None else {"shallow": draft.shallow}
            return self.handoff.forward(self.target, rows, **reuse)
        base = self.target.length
        positions = [base] + [base + d for d in draft.depths]
        return self.handoff.forward(self.target, rows, positions=positions, tree_mask=draft.mask())

    def _verify(
        self, draft: TokenTree, out: TargetOutput, sampling: SamplingConfig, gens: Generators
    ) -> tuple[list[int], int]:
        """(accepted node path, next token): the verifier on a chain, the tree rules on a tree."""
        logits = out.logits  # (n + 1, V)
        if self.shape is None:
            raw = self.verifier.reads_logits  # Spec-Verification reads logit gaps
            p = (logits if raw else logits_to_probs(logits, sampling)).unsqueeze(0)  # (1, k+1, V)
            q = draft.path_q()
            tokens = draft.tensor().unsqueeze(0).to(p.device)
            verdict = self.verifier(tokens, None if q is None else q.unsqueeze(0), p, gens.target)
            return list(range(int(verdict.num_accepted[0]))), int(verdict.next_tokens[0])
        if sampling.greedy:
            return verify_tree_greedy(draft, logits) if len(draft) else ([], int(logits[0].argmax()))
        return verify_tree_sampling(draft, logits_to_probs(logits, sampling), gens.target)

    def _commit(self, committed: int, draft: TokenTree, path: list[int], out: TargetOutput) -> None:
        """Keep the root and the accepted nodes in the target's cache (the next token is in no
        cache) and hand the drafter their rows."""
        if self.shape is None:
            self.target.rollback(committed + len(path))
            self.handoff.hand_over(out, len(path) + 1)
            return
        self.handoff.hand_over(out, [0] + [1 + i for i in path])
        if len(draft):
            self.target.compact([0] + [1 + i for i in path])

    def _round(self, draft: TokenTree, path: list[int], new_tokens: list[int], draft_s: float, verify_s: float):
        if self.shape is None:
            return Round(new_tokens, len(draft), len(path), draft_s=draft_s, verify_s=verify_s)
        events = {"tree_rounds": 1, "tree_nodes": len(draft), f"accepted_depth_{len(path)}": 1} if len(draft) else {}
        depth = max(draft.depths) if len(draft) else 0
        return Round(new_tokens, len(draft), len(path), draft_s, verify_s, events, draft_depth=depth)
