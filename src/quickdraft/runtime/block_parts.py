"""The parts a described block adds to Llama's (`llama_block.Block`; `families.py` says which family
uses which): the family's style (Gemma's norm, the GELU-tanh gate) and attention with soft-capped
scores (Gemma 2), each in Hugging Face's order and dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: the weight is an offset from 1, applied in float32 before the cast back."""
    return (F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps) * (1.0 + weight.float())).to(x.dtype)


@dataclass(frozen=True)
class BlockStyle:
    """What a family's block does differently from Llama's (`families.describe` reads it off a model):
    `norm` "llama" (weight after the cast back) or "gemma" (1 + weight, before it); `act` the MLP's
    gate activation, "silu" or "gelu_tanh"."""

    norm: str = "llama"
    act: str = "silu"


LLAMA = BlockStyle()


def capped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, cap: float
) -> torch.Tensor:
    """Attention with soft-capped scores (Gemma 2): ([B,] heads, T, d) queries over ([B,] kv_heads, S, d)
    keys and values; `mask` (T, S) or broadcastable bool (None: causal when T == S > 1, else all).
    Scores c * tanh(q.k / sqrt(d) / c), softmax in float32 as Hugging Face's eager attention."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.to(q.dtype).repeat_interleave(group, dim=-3), v.to(q.dtype).repeat_interleave(group, dim=-3)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = torch.tanh(scores / cap) * cap
    t, s = q.shape[-2], k.shape[-2]
    if mask is None and t > 1:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
