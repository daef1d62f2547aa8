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


def lenient_verify(
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
    lenience: float,
) -> Verdict:
    """Lossy verification of (B, k) drafts; shapes as in `speculative_verify`; lenience l in (0, 1]."""
    if not 0 < lenience <= 1:
        raise QuickdraftError(f"lenience must be in (0, 1], got {lenience}")
    B, k = draft_tokens.shape
    V = p_probs.shape[-1]
    valid = (draft_tokens >= 0) & (draft_tokens < V)
    safe = draft_tokens.clamp(0, V - 1).unsqueeze(-1)
    p_d = p_probs[:, :k].gather(-1, safe).squeeze(-1)  # (B, k)
    if q_probs is None:
        q_full = torch.zeros_like(p_probs[:, :k]).scatter_(-1, safe, 1.0)
    else:
        q_full = q_probs.to(p_probs.dtype)
    q_d = q_full.gather(-1, safe).squeeze(-1)
    u = torch.rand((B, k), generator=generator, dtype=p_probs.dtype)
    accept = valid & (p_d > 0) & (u < p_d / (lenience * q_d).clamp_min(torch.finfo(p_d.dtype).tiny))
    num_accepted = accept.long().cumprod(-1).sum(-1)
    rows = torch.arange(B)
    p_next = p_probs[rows, num_accepted]
    q_next = torch.zeros_like(p_next)
    rejected = num_accepted < k
    if rejected.any():
        r = rows[rejected]
        q_next[r] = lenience * q_full[r, num_accepted[rejected]]
    return Verdict(num_accepted=num_accepted, next_tokens=sample(residual(p_next, q_next), generator))


class LenientVerifier:
    """`lenient:L` by name. Lossy: outputs are not distributed as the target's."""

    lossy = True

    def __init__(self, lenience: float = 0.5):
        if not 0 < lenience <= 1:
            raise QuickdraftError(f"lenience must be in (0, 1], got {lenience}")
        self.lenience = lenience
        self.name = f"lenient:{lenience:g}"

    def __call__(self, draft_tokens, q_probs, p_probs, generator) -> Verdict:
        return lenient_verify(draft_tokens, q_probs, p_probs, generator, self.lenience)
