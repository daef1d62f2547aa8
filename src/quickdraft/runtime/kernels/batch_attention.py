"""RoPE, the cache write and attention of a whole batch's rows in one kernel call (`batch_attention.h`).

The batched forward (runtime/forward/llama_block.py) ran `rope_store` and `attend` once a sequence and
layer: at 64 sequences of the 135M, 1,920 pairs of calls a forward, each with its Python slicing and its
threads' start-up, which grew with the batch while the arithmetic stayed small (docs/performance.md,
"Many clients"). This call runs every sequence's rows through the same per-row functions, so each row's
result is the same bits as its own sequence's calls (tests/test_batch_attention.py).
"""

from __future__ import annotations

import torch

from quickdraft.runtime import kernels


def attend_batch(
    y: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    starts: torch.Tensor,
    mask: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """Fused q|k|v rows y (B T, (heads + 2 kv_heads) d), sequence b's T rows at b T, with cos, sin (B T, d):
    RoPE on q and k, k and v written into sequence b's row of a layer's (rows, kv_heads, capacity, d) cache
    at starts[b].. (starts: (B,) int64), then each row's attention over its own sequence's positions under
    mask ((B, T, span) bool) -> (B T, heads d)."""
    return kernels.fused_ops().attend_batch(y, cos, sin, k_cache, v_cache, starts, mask, heads, kv_heads)
