"""`attend_batch` (runtime/kernels/batch_attention.h): a batch's RoPE, cache writes and attention in one call,
each sequence's rows the same bits as its own `rope_store` and `attend` calls (every level: the inner
loop runs the chosen one, CI the others), the batched forward through it, and bad calls refused; with a
control that shows the comparison can fail."""

from __future__ import annotations

import pytest
import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.forward.llama_block import rope_tables

pytestmark = pytest.mark.skipif(kernels.fused_ops() is None, reason="the fused kernels could not be built here")

HEADS, KV = 6, 2


def batch_case(dtype, d: int, t: int, starts: list[int], seed: int = 0, cap: int = 48, rows: int = 5):
    """Random fused q|k|v rows for len(starts) sequences of t new rows each, their RoPE tables, a (rows, KV,
    cap, d) layer cache with random context, and a (B, t, span) mask (random over the context, causal
    among the new rows, every row sees itself)."""
    g = torch.Generator().manual_seed(seed)
    b = len(starts)
    k = torch.randn(rows, KV, cap, d, generator=g).to(dtype)
    v = torch.randn(rows, KV, cap, d, generator=g).to(dtype)
    y = (torch.randn(b * t, (HEADS + 2 * KV) * d, generator=g) * 2).to(dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    tables = [rope_tables(inv, torch.arange(s, s + t), dtype) for s in starts]
    cos, sin = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])
    span = max(starts) + t + 3
    mask = torch.rand(b, t, span, generator=g) > 0.3
    for i, s in enumerate(starts):
        mask[i, :, s:] = torch.ones(t, span - s, dtype=torch.bool).tril()  # causal; nothing past its rows
    return y, cos, sin, k, v, torch.tensor(starts), mask


def per_sequence(ops, y, cos, sin, k, v, starts, mask, t):
    """Each sequence's own rope_store and attend calls (what the batched forward ran before)."""
    out = []
    for i, s in enumerate(starts.tolist()):
        rows = slice(i * t, (i + 1) * t)
        q = ops.rope_store(
            y[rows].contiguous(), cos[rows].contiguous(), sin[rows].contiguous(), k[i], v[i], s, HEADS, KV
        )
        out.append(ops.attend(q, k[i], v[i], s + t, mask[i, :, : s + t].contiguous()))
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("d", [16, 64, 128])  # 16: the generic path everywhere; 64, 128: AVX-512's tiles too
@pytest.mark.parametrize("t", [1, 5])
def test_a_batch_equals_its_sequences_alone(dtype, d, t, ops):
    starts = [7, 30, 0, 19]
    case = batch_case(dtype, d, t, starts)
    y, cos, sin, k, v, st, mask = case
    k2, v2 = k.clone(), v.clone()
    got = ops.attend_batch(y, cos, sin, k, v, st, mask, HEADS, KV)
    want = per_sequence(ops, y, cos, sin, k2, v2, st, mask, t)
    assert torch.equal(got, want)
    assert torch.equal(k, k2) and torch.equal(v, v2)  # the same keys and values written, where they belong


def test_another_sequences_positions_are_told_apart(ops):  # negative control: the comparison can fail
    y, cos, sin, k, v, st, mask = batch_case(torch.float32, 64, 3, [7, 30, 0, 19])
    got = ops.attend_batch(y, cos, sin, k.clone(), v.clone(), st, mask, HEADS, KV)
    swapped = st[[1, 0, 2, 3]]
    mask2 = mask.clone()
    mask2[0], mask2[1] = mask[1], mask[0]
    want = per_sequence(ops, y, cos, sin, k.clone(), v.clone(), swapped, mask2, 3)
    assert not torch.equal(got, want)


def test_bad_calls_are_refused_by_what_is_wrong(ops):
    y, cos, sin, k, v, st, mask = batch_case(torch.float32, 16, 2, [3, 9])
    i32 = torch.tensor([3, 9], dtype=torch.int32)
    bad = [  # (what is wrong, the call)
        (
            "positions beyond the cache",
            lambda: ops.attend_batch(y, cos, sin, k, v, torch.tensor([3, 47]), mask, HEADS, KV),
        ),
        ("int32 starts", lambda: ops.attend_batch(y, cos, sin, k, v, i32, mask, HEADS, KV)),
        (
            "more sequences than rows",
            lambda: ops.attend_batch(y, cos, sin, k, v, torch.tensor([3, 9, 1]), mask, HEADS, KV),
        ),
        ("a mask of one row", lambda: ops.attend_batch(y, cos, sin, k, v, st, mask[:, :1].contiguous(), HEADS, KV)),
        ("an additive mask", lambda: ops.attend_batch(y, cos, sin, k, v, st, mask.float(), HEADS, KV)),
        ("the qkv width", lambda: ops.attend_batch(y, cos, sin, k, v, st, mask, HEADS + 1, KV)),
        ("unequal caches", lambda: ops.attend_batch(y, cos, sin, k, v[:, :, :8].contiguous(), st, mask, HEADS, KV)),
    ]
    for what, call in bad:
        with pytest.raises(RuntimeError, match="attend_batch"):
            call()
            pytest.fail(f"{what}: not refused")
