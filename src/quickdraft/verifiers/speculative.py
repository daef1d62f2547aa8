"""Lossless speculative sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023).

For each draft position i (left to right): accept d_i with probability min(1, p_i(d_i) / q_i(d_i));
at the first rejection draw the correction token from norm(max(0, p_i - q_i)); if all k drafts are
accepted draw a bonus token from p_{k+1}. The emitted token then has law p at every position.
A deterministic proposal (q_probs None) is the one-hot case: accept with probability p(d_i), and
on rejection sample p with d_i removed.
"""

from __future__ import annotations

import torch

from quickdraft.sampling import residual, sample
from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier


def speculative_verify(
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
    lenience: float = 1.0,
) -> Verdict:
    """Accept or reject a batch of drafts against the target.

    Args:
        draft_tokens: (B, k) int64 draft ids; ids outside [0, V) are always rejected.
        q_probs: (B, k, V) processed draft probabilities the drafts were sampled from, or None.
        p_probs: (B, k+1, V) processed target probabilities; row i scores draft i, row k the bonus.
        generator: the acceptance stream (uniforms and correction/bonus samples).
        lenience: l in (0, 1]; 1 is the lossless rule. l < 1 is DistillSpec's LOSSY lenient rule:
            accept with min(1, p / (l q)), correct from norm(max(0, p - l q)) (see verifiers.lenient).

    Returns:
        Verdict with num_accepted (B,) and next_tokens (B,).
    """
    B, k = draft_tokens.shape
    V = p_probs.shape[-1]
    valid = (draft_tokens >= 0) & (draft_tokens < V)  # (B, k)
    safe = draft_tokens.clamp(0, V - 1).unsqueeze(-1)  # (B, k, 1)
    p_d = p_probs[:, :k].gather(-1, safe).squeeze(-1)  # (B, k)
    q_d = torch.ones_like(p_d) if q_probs is None else q_probs.gather(-1, safe).squeeze(-1)
    u = torch.rand((B, k), generator=generator, dtype=p_probs.dtype, device=p_probs.device)
    # strict "<": a token with p = 0 is never accepted, even when u == 0
    accept = valid & (u < p_d / (lenience * q_d).clamp_min(torch.finfo(p_d.dtype).tiny))
    num_accepted = accept.long().cumprod(-1).sum(-1)  # (B,)

    rows = torch.arange(B, device=p_probs.device)
    p_next = p_probs[rows, num_accepted]  # (B, V)
    q_next = torch.zeros_like(p_next)  # zero q row => bonus token from p itself
    rejected = num_accepted < k
    if rejected.any():
        r = rows[rejected]
        pos = num_accepted[rejected]
        if q_probs is None:
            tok = draft_tokens[r, pos]
            ok = valid[r, pos]
            q_next[r[ok], tok[ok]] = lenience
        else:
            q_next[r] = lenience * q_probs[r, pos].to(q_next.dtype)
    next_tokens = sample(residual(p_next, q_next), generator)
    return Verdict(num_accepted=num_accepted, next_tokens=next_tokens)


class SpeculativeSampling(Verifier):
    """The lossless verifier as an object chosen by name ("speculative")."""

    name = "speculative"
    lossy = False

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return speculative_verify(draft_tokens, q_probs, p_probs, generator)
