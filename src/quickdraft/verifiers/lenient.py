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
from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier
from quickdraft.verifiers.speculative import speculative_verify


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
    return speculative_verify(draft_tokens, q_probs, p_probs, generator, lenience)


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
