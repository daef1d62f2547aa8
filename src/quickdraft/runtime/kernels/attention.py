"""Attention of a few query rows over one layer's cache (`attention.h`: `attend`), and when a prompt's
prefill takes it rather than torch's flash SDPA (`long_attention`).

Up to `ATTEND_ROWS` rows attend through the kernel, more (a prompt's prefill) through torch's flash
SDPA, whose GEMMs pay there, unless `long_attention` says the kernel's AVX-512 path wins. Every verify
width stays on the kernel: its sums run in key order, one key at a time, so a row's attention is the
same bits whatever the width, and with the per-row norm, RoPE and SwiGLU kernels and the packed linear
(a fixed k order per row) the whole forward is batch-invariant: greedy speculation equals plain
decoding exactly in bf16 too. The kernel reads a block of keys once for a task's rows (up to 32 rows of
one kv head), so a verify at a long context does not stream the cache once per row and head.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

from quickdraft.host import cpu_features
from quickdraft.runtime import kernels

ATTEND_ROWS = 64


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, mask: torch.Tensor | None
) -> torch.Tensor:
    """q (T, heads * d) over the first `length` positions of a layer's (kv_heads, capacity, d) keys and
    values (grouped-query heads; mask (T, length) bool or None: causal after length - T) -> (T, heads * d)."""
    return kernels.fused_ops().attend(q, k_cache, v_cache, length, mask)


KERNEL_CONTEXT = 2048  # keys: the longest context a prefill's rows attend through the kernel
_invariant = threading.local()  # `invariant_prefill` on in this thread


@contextlib.contextmanager
def invariant_prefill():
    """Within it (this thread), every prefill row up to KERNEL_CONTEXT keys attends through the kernel on
    every host, where `long_attention` alone would take SDPA (an AMX host; an AVX2 one): a row is then the
    same bits whatever piece of the prompt it is prefilled in. The batched path's prefills need it: their
    pieces, and the prefixes they take from other requests, depend on what else the server runs, and
    SDPA's sums depend on the piece (greedy answers changed with the load: docs/performance.md, "Many
    clients"). What runs beyond KERNEL_CONTEXT stays SDPA's: `runtime/caches/prefix_store.reusable` says what a
    prefill may take there."""
    before = getattr(_invariant, "on", False)
    _invariant.on = True
    try:
        yield
    finally:
        _invariant.on = before


def long_attention(dtype: torch.dtype, head_dim: int, context: int) -> bool:
    """Whether a prefill's many rows over `context` keys take the `attend` kernel rather than torch's
    flash SDPA: its AVX-512 path (bf16 or float32 rows, heads of 64, 128 or 256) on a CPU without AMX,
    up to KERNEL_CONTEXT keys (one prefill chunk's). Measured (docs/performance.md, "Long-prompt
    attention", scripts/attention_costs.py): on AVX-512 without AMX the kernel beat SDPA over a few
    hundred causal rows; with AMX, SDPA's bf16 tiles won at every prefill length; past a chunk's keys
    SDPA won even in float32, where it has no AMX, so the kernel stops there everywhere. Within its range
    a prefill row is the same bits as the row decoded alone (on every host within `invariant_prefill`)."""
    if context <= KERNEL_CONTEXT and getattr(_invariant, "on", False):
        return True
    vector = dtype in (torch.bfloat16, torch.float32) and head_dim in (64, 128, 256) and _vector_attention()
    return vector and context <= KERNEL_CONTEXT


@functools.cache
def _vector_attention() -> bool:  # found once a process, as the kernels' level
    return (
        kernels.fused_ops() is not None
        and kernels.chosen_level().startswith("avx512")
        and "amx_bf16" not in cpu_features()
    )
