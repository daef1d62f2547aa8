"""Lossless speculative sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023) on chains.

A chain is a one-wide token tree, so this is the tree sampling rule (`verifiers/tree.py`:
`verify_tree_sampling`) applied to each row's path: for each draft position i (left to right) accept
d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw the correction token
from norm(max(0, p_i - q_i)); if all k drafts are accepted draw a bonus token from p_{k+1}. A
deterministic proposal (q_probs None) is the one-hot case: accept with probability p(d_i), and on
rejection sample p with d_i removed. There is no second copy of the rule here: this file only lays
a batch of chains out as paths.
"""

from __future__ import annotations

import torch

from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier
from quickdraft.verifiers.tree import TokenTree, verify_tree_sampling


def speculative_verify(
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Accept or reject a batch of drafts against the target, row by row through the tree rule.

    Args:
        draft_tokens: (B, k) int64 draft ids; an id outside [0, V) ends its row's draft there (it
            and everything after it are rejected; the next token is then drawn from p at its row).
        q_probs: (B, k, V) processed draft probabilities the drafts were sampled from, or None.
        p_probs: (B, k+1, V) processed target probabilities; row i scores draft i, row k the bonus.
        generator: the acceptance stream: per row, one uniform per draft token, then one sample.
            A batch of one consumes it exactly as the vectorised chain rule did.

    Returns:
        Verdict with num_accepted (B,) and next_tokens (B,).
    """
    B, k = draft_tokens.shape
    V = p_probs.shape[-1]
    accepted, nexts = [], []
    for b, row in enumerate(draft_tokens.tolist()):
        m = next((i for i, t in enumerate(row) if not 0 <= t < V), k)  # the valid prefix
        path = TokenTree.path(row[:m], None if q_probs is None else q_probs[b, :m])
        nodes, token = verify_tree_sampling(path, p_probs[b, : m + 1], generator)
        accepted.append(len(nodes))
        nexts.append(token)
    device = p_probs.device
    return Verdict(
        num_accepted=torch.tensor(accepted, dtype=torch.long, device=device),
        next_tokens=torch.tensor(nexts, dtype=torch.long, device=device),
    )


class SpeculativeSampling(Verifier):
    """The lossless verifier as an object chosen by name ("speculative")."""

    name = "speculative"
    lossy = False

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return speculative_verify(draft_tokens, q_probs, p_probs, generator)
