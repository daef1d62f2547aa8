"""Greedy verification on chains: the tree greedy rule (`verifiers/tree.py`: `follow_greedy`) on
each row's path, i.e. the longest prefix where the draft equals the target's argmax."""

from __future__ import annotations

import torch

from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier
from quickdraft.verifiers.tree import TokenTree, follow_greedy


def greedy_verify(draft_tokens: torch.Tensor, p_probs: torch.Tensor) -> Verdict:
    """Prefix match against argmax p, row by row through the tree rule.

    Args:
        draft_tokens: (B, k) int64 draft ids.
        p_probs: (B, k+1, V) target probabilities or logits (only the argmax is used).

    Returns:
        Verdict: num_accepted (B,) = length of the matching prefix; next_tokens (B,) = the target's
        argmax at the first mismatch, or the bonus argmax after k matches.
    """
    best = p_probs.argmax(-1).tolist()  # (B, k+1), read once
    accepted, nexts = [], []
    for row, want in zip(draft_tokens.tolist(), best, strict=True):
        nodes, token = follow_greedy(TokenTree.path(row), want)
        accepted.append(len(nodes))
        nexts.append(token)
    device = p_probs.device
    return Verdict(
        num_accepted=torch.tensor(accepted, dtype=torch.long, device=device),
        next_tokens=torch.tensor(nexts, dtype=torch.long, device=device),
    )


class GreedyMatch(Verifier):
    """Greedy verifier as an object chosen by name ("greedy"); ignores q and the generator."""

    name = "greedy"
    lossy = False

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return greedy_verify(draft_tokens, p_probs)
