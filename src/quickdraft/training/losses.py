"""Token-level divergences between the target's p and the draft's q (DistillSpec, arXiv 2310.08461).

Named by formula, never by library convention:

- ``fkl``  = KL(p || q) = sum_v p log(p / q)     (forward KL, mean-seeking)
- ``rkl``  = KL(q || p) = sum_v q log(q / p)     (reverse KL, mode-seeking)
- ``jsd:B``= B KL(p || m) + (1 - B) KL(q || m),  m = B p + (1 - B) q   (B = 0.5 is the symmetric JSD)
- ``tvd``  = 1/2 sum_v |p - q|  = 1 - sum_v min(p, q), i.e. 1 - the speculative acceptance rate

Every divergence is summed over the vocabulary and averaged over the scored tokens. p and q first go
through the same processing (temperature, top-k, top-p) that speculative decoding will apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import processed_logits

_NEG = -1e4  # stands in for log(0) inside a product with a zero weight


@dataclass(frozen=True)
class LossProcessing:
    """The processing p and q share in the loss: temperature (> 0), then top-k, then top-p."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise QuickdraftError(f"loss temperature must be > 0, got {self.temperature}")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise QuickdraftError(f"bad loss top_k/top_p: {self.top_k}, {self.top_p}")


def processed_logprobs(logits: torch.Tensor, proc: LossProcessing) -> torch.Tensor:
    """(N, V) logits -> (N, V) log-probabilities after temperature/top-k/top-p (-inf outside).

    The processing is inference's own (`sampling.processed_logits`), so the loss sees exactly the p
    and q that speculative sampling will compare. The top-k/top-p support is chosen without
    gradient; inside it the log-softmax is differentiable.
    """
    sampling = SamplingConfig(temperature=proc.temperature, top_k=proc.top_k, top_p=proc.top_p)
    return torch.log_softmax(processed_logits(logits.float(), sampling), dim=-1)


def _kl(la: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """sum_v a (log a - log b) per row, with 0 log 0 = 0. la, lb: (N, V) log-probs -> (N,)."""
    a = la.exp()
    terms = a * (la.clamp_min(_NEG) - lb.clamp_min(_NEG))
    return torch.where(a > 0, terms, torch.zeros_like(terms)).sum(-1)


def fkl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per token: (N, V), (N, V) -> (N,)."""
    return _kl(lp, lq)


def rkl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """KL(q || p) per token: (N, V), (N, V) -> (N,)."""
    return _kl(lq, lp)


def jsd(lp: torch.Tensor, lq: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q, per token -> (N,)."""
    if not 0 < beta < 1:
        raise QuickdraftError(f"jsd beta must be in (0, 1), got {beta}")
    lm = torch.logsumexp(torch.stack([lp + math.log(beta), lq + math.log(1 - beta)]), dim=0)
    return beta * _kl(lp, lm) + (1 - beta) * _kl(lq, lm)


def tvd(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """1/2 sum_v |p - q| per token (summed over the vocabulary, NOT averaged over it) -> (N,)."""
    return 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)


def acceptance(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """Expected speculative acceptance sum_v min(p, q) per token -> (N,). Equals 1 - tvd."""
    return torch.minimum(lp.exp(), lq.exp()).sum(-1)


Divergence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def parse_divergence(text: str) -> tuple[str, float]:
    """The one parser of a divergence spec: fkl, rkl, tvd, jsd (beta 0.5) or jsd:BETA -> (name, beta)
    (beta is 0.5 and unused for the others); a bad name or beta is refused by name."""
    name, _, arg = text.partition(":")
    if name in ("fkl", "rkl", "tvd") and not arg:
        return name, 0.5
    if name == "jsd":
        try:
            beta = float(arg) if arg else 0.5
        except ValueError:
            raise QuickdraftError(f"jsd beta must be a number, got {arg!r}") from None
        if not 0 < beta < 1:
            raise QuickdraftError(f"jsd beta must be in (0, 1), got {beta}")
        return name, beta
    raise QuickdraftError(f"unknown divergence {text!r}; choose fkl (KL(p||q)), rkl (KL(q||p)), jsd[:BETA] or tvd")


def make_divergence(text: str) -> Divergence:
    """Pick a divergence by its spec (`parse_divergence`)."""
    name, beta = parse_divergence(text)
    if name == "jsd":
        return lambda lp, lq: jsd(lp, lq, beta)
    return {"fkl": fkl, "rkl": rkl, "tvd": tvd}[name]


def distill_loss(
    p_logits: torch.Tensor, q_logits: torch.Tensor, mask: torch.Tensor, divergence: Divergence, proc: LossProcessing
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean divergence and mean expected acceptance over scored positions.

    Args:
        p_logits: (B, T, V) target logits (no gradient needed).
        q_logits: (B, T, V) draft logits (with gradient).
        mask: (B, T) bool, True where position t is scored (it predicts a response token).
        divergence: one of the functions above.
        proc: the shared processing.

    Returns:
        (loss scalar with grad, expected acceptance scalar without grad).
    """
    V = min(p_logits.shape[-1], q_logits.shape[-1])  # slice a padded vocabulary tail
    sel = mask.bool()
    lp = processed_logprobs(p_logits[..., :V][sel], proc)  # (N, V)
    lq = processed_logprobs(q_logits[..., :V][sel], proc)  # (N, V)
    if lp.shape[0] == 0:
        raise QuickdraftError("the batch has no scored tokens")
    loss = divergence(lp.detach(), lq).mean()
    with torch.no_grad():
        acc = acceptance(lp, lq).mean()
    return loss, acc


def restrict_top(
    top_ids: torch.Tensor, top_logp: torch.Tensor, head_ids: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's cached top k seen through a draft head restricted to `head_ids` (K,): ids mapped to
    head rows, the log-probs of ids off the head set to -inf (`topk_divergence` renormalises p over the
    rest), and which rows keep any mass: (ids (M, k), logp (M, k), keep (N,) bool), M = keep.sum().
    A draft that cannot propose a token is trained on the target's law over the tokens it can."""
    index = torch.full((vocab,), -1, dtype=torch.long, device=top_ids.device)
    index[head_ids.to(top_ids.device)] = torch.arange(head_ids.numel(), device=top_ids.device)
    mapped = index[top_ids]  # (N, k)
    inside = mapped >= 0
    keep = inside.any(-1)
    logp = top_logp.masked_fill(~inside, float("-inf"))
    return mapped.clamp_min(0)[keep], logp[keep], keep
