"""The verifier base: the call every verifier answers and the capabilities it declares."""

from __future__ import annotations

import torch

from quickdraft.types import Verdict


class Verifier:
    """`(draft_tokens (B,k), q_probs (B,k,V)|None, p_probs (B,k+1,V), generator) -> Verdict`.

    Attributes:
        name: labels statistics.
        lossy: it may change the target's output distribution.
        reads_logits: decoders pass it the target's raw logits (B, k+1, V) instead of processed
            probabilities (Spec-Verification reads logit gaps).
    """

    name: str = "verifier"
    lossy: bool = False
    reads_logits: bool = False

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q_probs: torch.Tensor | None,
        p_probs: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Verdict:
        raise NotImplementedError


class TreeRule(Verifier):
    """The label of the token-tree rules (`verifiers/tree.py`): lossless, called by the tree decoder."""

    name = "tree"
