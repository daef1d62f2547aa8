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


def filters(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-k or top-p removes any of `vocab` tokens."""
    return 0 < top_k < vocab or top_p < 1.0


def support(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """The tokens top-k then top-p keep, from temperature-scaled logits x: (..., V) bool, or None (all)."""
    vocab = x.shape[-1]
    if not filters(top_k, top_p, vocab):
        return None
    keep = None
    if 0 < top_k < vocab:
        keep = x >= torch.topk(x, top_k, dim=-1).values[..., -1:]
    if top_p < 1.0:  # the smallest most-likely set whose mass reaches top_p (at least one token)
        probs = torch.softmax(x if keep is None else x.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        keep_sorted = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        keep_sorted[..., 0] = True
        nucleus = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        keep = nucleus if keep is None else keep & nucleus
    return keep


def processed_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature (> 0), then top-k, then top-p: (..., V) logits in the probability dtype, -inf outside
    the kept set. Differentiable in the kept entries (the distillation loss uses it; the kept set is
    chosen without gradient)."""
    if config.greedy:
        raise ValueError("processed_logits needs a temperature > 0 (greedy has no logits to process)")
    x = logits.to(_prob_dtype(logits)) / config.temperature
    if not filters(config.top_k, config.top_p, x.shape[-1]):
        return x
    with torch.no_grad():
        keep = support(x.detach(), config.top_k, config.top_p)  # not None: a filter applies
    return torch.where(keep, x, float("-inf"))


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, then softmax.

    Args:
        logits: (..., V) raw logits of any float dtype.
        config: the request's sampling configuration. Temperature 0 gives a one-hot on the argmax.

    Returns:
        (..., V) probabilities in float32 (float64 for float64 input), rows summing to 1.
    """
    if config.greedy:
        x = logits.to(_prob_dtype(logits))
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(processed_logits(logits, config), dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row by inverting its CDF. probs: (..., V) -> (...) int64.

    The row's running sums (accumulated and kept in float64) are searched for u = (1 - r) x total, r
    uniform in [0, 1) from `generator`: the first id whose sum reaches u. u lies in (0, total], so a
    zero-probability id (equal sums on both sides) is never drawn and the search never runs off the
    end. One uniform a row: torch.multinomial draws one exponential an id, an order of magnitude slower
    on a 32,768- or 151,936-id row (docs/benchmarks.md).
    """
    if probs.dim() == 1 and probs.device.type == "cpu":  # one row: u in Python's float64, the same bits
        cdf = probs.cumsum(0, dtype=torch.float64)
        r = torch.rand(1, generator=generator, dtype=torch.float64).item()
        return torch.searchsorted(cdf, (1.0 - r) * cdf[-1].item())
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = flat.cumsum(-1, dtype=torch.float64)  # (R, V)
    r = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=flat.device)
    return torch.searchsorted(cdf, torch.rsub(r, 1.0).mul_(cdf[:, -1:])).reshape(probs.shape[:-1])


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Gumbel-max: argmax(log p + g) per row, a draw from p when g is standard Gumbel noise
    (-log(-log u), u uniform). probs: (..., V), noise: (..., V) -> (...) int64. Zero-probability ids
    (top-k, top-p) get -inf and are never drawn."""
    return (probs.log() + noise).argmax(-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax per row (the first of equal maxima). logits: (..., V) -> (...) int64. Half-precision rows
    are widened first (exact): torch's bf16 argmax on the CPU is several times slower than float32's."""
    return (logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits).argmax(-1)


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
