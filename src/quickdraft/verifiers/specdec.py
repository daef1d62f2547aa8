"""Spec-Verification (SpecDec, arXiv 2203.16487): accept a draft token while it is among the
target's top-beta tokens and its log-probability is within tau of the top-1's.

Deterministic and greedy-only: the correction at the first rejected position (or the bonus after
the last draft) is the target's argmax. beta = 1 is exactly greedy verification (tau is then
irrelevant: only the top-1 passes); beta > 1 is LOSSY, labelled so wherever it is reported. It reads
the target's raw logits (log-probability gaps equal logit gaps), not the one-hot p of temperature 0.
"""

from __future__ import annotations

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier


def spec_verify(draft_tokens: torch.Tensor, logits: torch.Tensor, beta: int, tau: float) -> Verdict:
    """Top-beta-within-tau prefix acceptance.

    Args:
        draft_tokens: (B, k) int64 draft ids.
        logits: (B, k+1, V) the target's raw logits at the k draft positions and the one after.
        beta: how many of the target's top tokens may be accepted (>= 1).
        tau: the largest accepted gap log p(top-1) - log p(draft) (>= 0).

    Returns:
        Verdict: num_accepted (B,), the accepted prefix length; next_tokens (B,), the target's
        argmax at the first rejection (or after the last draft).
    """
    k = draft_tokens.shape[1]
    x = logits.float()
    top = x[:, :k].topk(min(beta, x.shape[-1]), dim=-1)  # (B, k, beta)
    in_top = (top.indices == draft_tokens.unsqueeze(-1)).any(-1)
    gap = top.values[..., 0] - x[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    ok = in_top & (gap <= tau)
    num_accepted = ok.long().cumprod(-1).sum(-1)
    next_tokens = x.argmax(-1).gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return Verdict(num_accepted=num_accepted, next_tokens=next_tokens)


class SpecVerifier(Verifier):
    """`specdec:beta=B,tau=T` by name (default beta 5, tau 3, the paper's inference setting)."""

    reads_logits = True  # decoders pass raw logits, not probabilities

    def __init__(self, beta: int = 5, tau: float = 3.0) -> None:
        if beta < 1 or tau < 0:
            raise QuickdraftError(f"Spec-Verification needs beta >= 1 and tau >= 0, got beta={beta}, tau={tau}")
        self.beta, self.tau = int(beta), float(tau)
        self.name = f"specdec:beta={self.beta},tau={self.tau:g}"
        self.lossy = self.beta > 1

    def __call__(self, draft_tokens, q_probs, logits, generator) -> Verdict:
        return spec_verify(draft_tokens, logits, self.beta, self.tau)


def parse_specdec(arg: str) -> SpecVerifier:
    """ "beta=B,tau=T" (either may be left out) -> SpecVerifier."""
    values = {"beta": "5", "tau": "3"}
    for item in filter(None, arg.split(",")):
        key, _, value = item.partition("=")
        if key not in values or not value:
            raise QuickdraftError(f"verifier 'specdec:{arg}': use specdec:beta=B,tau=T (got {item!r})")
        values[key] = value
    try:
        return SpecVerifier(int(values["beta"]), float(values["tau"]))
    except ValueError:
        raise QuickdraftError(f"verifier 'specdec:{arg}': beta must be an integer, tau a number") from None
