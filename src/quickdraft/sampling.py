"""Pure functions from logits to processed probabilities and tokens.

One function, `logits_to_probs`, processes both the target's p and the draft's q, so that the
acceptance ratio p(x)/q(x) compares the distributions the user asked to sample from. All
probability math runs in float32 (float64 for float64 models), whatever the model's dtype.
"""

from __future__ import annotations

import torch

from quickdraft.config import SamplingConfig


def _prob_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, then softmax.

    Args:
        logits: (..., V) raw logits of any float dtype.
        config: the request's sampling configuration. Temperature 0 gives a one-hot on the argmax.

    Returns:
        (..., V) probabilities in float32 (float64 for float64 input), rows summing to 1.
    """
    x = logits.to(_prob_dtype(logits))
    if config.greedy:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    x = x / config.temperature
    if 0 < config.top_k < x.shape[-1]:
        kth = torch.topk(x, config.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if config.top_p < 1.0:
        probs = _top_p_filter(probs, config.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p (at least one token); renormalise."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row. probs: (..., V) -> (...) int64."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax per row. logits: (..., V) -> (...) int64."""
    return logits.argmax(-1)


def residual(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """norm(max(0, p - q)), the recovery distribution after a rejection (Leviathan et al., eq. 1).

    Falls back to p where the clamped difference has (numerically) no mass: then p == q and a
    rejection had probability 0, so any choice is exact; p keeps the result inside p's support.

    Args:
        p, q: (..., V) probabilities.

    Returns:
        (..., V) probabilities.
    """
    diff = (p - q).clamp_min(0)
    mass = diff.sum(-1, keepdim=True)
    return torch.where(mass > eps, diff / mass.clamp_min(eps), p)
