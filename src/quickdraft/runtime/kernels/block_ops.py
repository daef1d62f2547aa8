"""The block's small ops as one kernel call each (`block_ops.h`), row by row in a fixed order, so a
row's result is the same bits whatever rows run beside it: the norm with its residual add, RoPE with
the cache write, the gated activations. Callers check `kernels.usable(x)` first; rows are (T, width)
and contiguous, in bf16, float32 or float64.
"""

from __future__ import annotations

import torch

from quickdraft.runtime import kernels


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, RMSNorm of it) over (T, H) rows, Hugging Face's arithmetic (the sum is x itself
    when `residual` is None)."""
    s, normed = kernels.fused_ops().add_rms_norm(x, residual, weight, eps)
    return s, normed


def rope_store(
    y: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    at: int,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """RoPE on the q and k parts of fused q|k|v rows y (T, (heads + 2 kv_heads) d) with cos, sin (T, d);
    k and v written into a layer's (kv_heads, capacity, d) cache at positions at..at+T -> q (T, heads d)."""
    return kernels.fused_ops().rope_store(y, cos, sin, k_cache, v_cache, at, heads, kv_heads)


def gated_mul(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """act(gate) * up over fused gate|up rows (T, 2 I) -> (T, I): SiLU (SwiGLU) or GELU-tanh (GeGLU)."""
    ops = kernels.fused_ops()
    return (ops.gelu_tanh_mul if gelu else ops.silu_mul)(gate_up)
