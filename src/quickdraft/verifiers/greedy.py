"""Greedy verification: accept the longest prefix where the draft equals the target's argmax."""

from __future__ import annotations

import torch

from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier


def greedy_verify(draft_tokens: torch.Tensor, p_probs: torch.Tensor) -> Verdict:
    """Prefix match against argmax p.

    Args:
        draft_tokens: (B, k) int64 draft ids.
        p_probs: (B, k+1, V) target probabilities or logits (only the argmax is used).

    Returns:
        Verdict: num_accepted (B,) = length of the matching prefix; next_tokens (B,) = the target's
        argmax at the first mismatch, or the bonus argmax after k matches.
    """
    target_tokens = p_probs.argmax(-1)  # (B, k+1)
    k = draft_tokens.shape[1]
    match = draft_tokens == target_tokens[:, :k]
    num_accepted = match.long().cumprod(-1).sum(-1)
    next_tokens = target_tokens.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return Verdict(num_accepted=num_accepted, next_tokens=next_tokens)


class GreedyMatch(Verifier):
    """Greedy verifier as an object chosen by name ("greedy"); ignores q and the generator."""

    name = "greedy"
    lossy = False

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return greedy_verify(draft_tokens, p_probs)
