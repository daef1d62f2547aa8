"""A block's elementwise parts: Llama's RMSNorm and RoPE, and what a described block adds to Llama's
(`llama_block.Block`; `families.py` says which family uses which): the family's style (Gemma's norm,
the GELU-tanh gate) and attention with soft-capped scores (Gemma 2), each in Hugging Face's order and
dtypes, except in the lean forms below.

Lean forms (issue #50): on a GPU a small model's step costs its kernel count (each kernel about 2 us,
docs/gpu.md), so half-precision rows on CUDA take forms with fewer kernels: RMSNorm as one fused
kernel with its weight (Hugging Face's takes four: cast, norm, cast back, weight), RoPE as a product
and two fused multiply-adds (Hugging Face's takes five: product, negation, concatenation, product,
sum). They round once where Hugging Face rounds twice, so bf16 rows differ from the CPU's in the last
bit now and then (CUDA's GEMMs already do); float32 and float64 keep Hugging Face's forms everywhere.
`LEAN["cpu"] = True` runs them on a CPU too (the tests check them there against the reference);
QUICKDRAFT_LEAN=0 switches them off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LEAN = {"cpu": False, "off": os.environ.get("QUICKDRAFT_LEAN") == "0"}
HALF = (torch.bfloat16, torch.float16)


def lean_device(x: torch.Tensor) -> bool:
    """Whether `x` is where the lean forms run: CUDA (or a CPU when asked), unless switched off. Exact
    lean steps (a batch's additive masks made once a forward: `native.forward_batch`) ask only this."""
    return (x.is_cuda or LEAN["cpu"]) and not LEAN["off"]


def lean(x: torch.Tensor) -> bool:
    """Whether `x`'s rows take the lean forms that round differently: half precision, `lean_device`."""
    return x.dtype in HALF and lean_device(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm (in float32, weight applied after the cast back), one fused op; the
    lean form: one kernel, the weight applied in float32 before the one rounding."""
    if lean(x):
        return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)
    return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last dimension of `x` (cos, sin broadcast against it); the lean form: x cos, then
    each half's rotated term added in one fused multiply-add."""
    half = x.shape[-1] // 2
    if lean(x):
        out = x * cos
        out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
        out[..., half:].addcmul_(x[..., :half], sin[..., half:])
        return out
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


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
