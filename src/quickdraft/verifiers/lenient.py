"""Lenient (LOSSY) speculative sampling: the DistillSpec latency/quality knob (Leviathan et al. 2023, app. A.5).

With lenience l in (0, 1]: accept draft d with probability min(1, p(d) / (l q(d))); at the first
rejection draw the correction from norm(max(0, p - l q)); if all drafts pass, the bonus comes from p.
l = 1 is exactly lossless speculative sampling. Smaller l accepts more drafts and moves the output
law from p towards q: the output is no longer the target's, and every report labels it lossy.

At temperature 0 the processed p and q are one-hot, so lenience changes nothing; it is refused there.
"""

from __future__ import annotations

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.sampling import residual, sample
from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier


def lenient_verify(
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
    lenience: float,
) -> Verdict:
    """Lossy verification of (B, k) drafts, vectorised over the batch (a named rule of its own: the
    lossless rules live in `verifiers/tree.py`).

    Args:
        draft_tokens: (B, k) int64 draft ids; ids outside [0, V) are always rejected.
        q_probs: (B, k, V) processed draft probabilities the drafts were sampled from, or None
            (deterministic drafts: a one-hot q).
        p_probs: (B, k+1, V) processed target probabilities; row i scores draft i, row k the bonus.
        generator: the acceptance stream ((B, k) uniforms, then B correction/bonus samples).
        lenience: l in (0, 1]: accept with min(1, p / (l q)), correct from norm(max(0, p - l q)).

    Returns:
        Verdict with num_accepted (B,) and next_tokens (B,).
    """
    if not 0 < lenience <= 1:
        raise QuickdraftError(f"lenience must be in (0, 1], got {lenience}")
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


class LenientVerifier(Verifier):
    """`lenient:L` by name. Lossy: outputs are not distributed as the target's."""

    lossy = True

    def __init__(self, lenience: float = 0.5):
        if not 0 < lenience <= 1:
            raise QuickdraftError(f"lenience must be in (0, 1], got {lenience}")
        self.lenience = lenience
        self.name = f"lenient:{lenience:g}"

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return lenient_verify(draft_tokens, q_probs, p_probs, generator, self.lenience)
