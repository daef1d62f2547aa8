"""Attention of a few query rows over one layer's cache (`attention.h`: `attend`), and when it beats
torch's flash SDPA over many rows (`long_attention`).

Up to `ATTEND_ROWS` rows attend through the kernel, more (a prompt's prefill) through torch's flash
SDPA, whose GEMMs pay there, unless the kernel's AVX-512 path runs. Every verify width stays on the
kernel: its sums run in key order, one key at a time, so a row's attention is the same bits whatever
the width, and with the per-row norm, RoPE and SwiGLU kernels and the packed linear (a fixed k order
per row) the whole forward is batch-invariant: greedy speculation equals plain decoding exactly in
bf16 too. Measured (scripts/step_profile.py, docs/benchmarks.md): before it read each row's keys only
up to its last attended one, the kernel beat SDPA at a few rows, tied around 9 and lost at 17.
"""

from __future__ import annotations

import functools

import torch

from quickdraft.runtime import kernels

ATTEND_ROWS = 64


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, mask: torch.Tensor | None
) -> torch.Tensor:
    """q (T, heads * d) over the first `length` positions of a layer's (kv_heads, capacity, d) keys and
    values (grouped-query heads; mask (T, length) bool or None: causal after length - T) -> (T, heads * d)."""
    return kernels.fused_ops().attend(q, k_cache, v_cache, length, mask)


def long_attention(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the `attend` kernel beats torch's flash SDPA over many rows (a prompt's prefill): its
    AVX-512 path (bf16 or float32 rows, heads of 64, 128 or 256), which reads each row's keys only up to
    its last attended one. Measured over a prompt's causal rows (docs/benchmarks.md): the AVX-512 path
    beat SDPA, the scalar path of an AVX2 level did not."""
    return dtype in (torch.bfloat16, torch.float32) and head_dim in (64, 128, 256) and _vector_attention()


@functools.cache
def _vector_attention() -> bool:  # found once a process, as the kernels' level
    return kernels.fused_ops() is not None and kernels.chosen_level().startswith("avx512")
