"""One Llama decoder block and one KV cache, shared by the native target (`native.py`) and the draft
modules that reuse its shape (`draft_heads.py`: the feature head, Kangaroo's adapter, SpecDec's block
drafter).

The arithmetic is Hugging Face's, in its order and dtypes (RMSNorm in float32 with the weight applied
after the cast back, RoPE tables in float32 cast to the activations' dtype, SDPA attention with
grouped-query heads), so the native target's logits equal Hugging Face's to rounding (1e-10 in
float64). A block's linears are callables (plain, packed bf16, int8 or int4 kernels: `linear.py`,
`quant.py`, or a module's own `nn.Linear`), and q/k/v (gate/up) may be one fused call.

`KVCache` is the one position-indexed cache: (layers, kv_heads, capacity, head_dim) keys and values,
grown by doubling (rarely: the capacity starts at the expected length), `length` valid positions;
rollback sets a length (nothing is copied) and `keep` moves a chosen subset of new rows into place
(the accepted path of a tree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quickdraft.runtime import kernels
from quickdraft.runtime.block_parts import LLAMA, BlockStyle, capped_attention, gemma_norm
from quickdraft.runtime.linear import apply_rows


class KVCache:
    """Preallocated keys and values for `layers` blocks: (layers, kv_heads, capacity, head_dim) each.

    Args:
        capacity: positions allocated up front (grown by doubling when a write needs more).
        limit: the most positions it may ever hold (the model's context).
    """

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype, device, capacity: int = 512, limit: int = 1 << 30
    ) -> None:
        self.limit = limit
        shape = (layers, kv_heads, min(capacity, limit), head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def ensure(self, length: int) -> None:
        """Room for `length` positions."""
        if length > self.capacity:
            new = grown_capacity(length, self.capacity, self.limit)
            self.k, self.v = grow(self.k, 2, new), grow(self.v, 2, new)

    def rollback(self, length: int) -> None:
        """Keep positions [0, length): a new length, nothing copied."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        self.length = length

    def keep(self, rows: torch.Tensor, dst: int, layers: slice = slice(None)) -> None:
        """Copy positions `rows` (m,) to dst..dst+m (all layers, or `layers`) and end the cache there:
        keep a chosen subset of new rows."""
        for t in (self.k, self.v):
            t[layers, :, dst : dst + rows.numel()] = t[layers, :, rows]
        self.length = dst + rows.numel()

    def attend(
        self, layer: int, at: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Store (kv_heads, T, d) keys and values at at..at+T of `layer`, then attend (heads, T, d)
        queries over [0, at + T) under `mask` ((T, at + T) bool, None: everything): (heads, T, d)."""
        keys, values = self.write(layer, at, k, v)
        if keys.dtype != q.dtype:  # a cache kept in another dtype than the activations
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]

    def write(self, layer: int, at: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (kv_heads, n, head_dim) keys and values at positions at..at+n of `layer`; returns the
        layer's keys and values over [0, at + n) in the cache's dtype."""
        n = k.shape[1]
        self.k[layer, :, at : at + n] = k
        self.v[layer, :, at : at + n] = v
        return self.k[layer, :, : at + n], self.v[layer, :, : at + n]


def grown_capacity(length: int, capacity: int, limit: int) -> int:
    """The capacity a cache grows to for `length` positions: doubled (at least `length`, at most
    `limit`); more than `limit` is an error."""
    if length > limit:
        raise ValueError(f"KV cache of {length} positions exceeds the model's context of {limit}")
    return min(limit, max(length, 2 * capacity))


def grow(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """`t` with dimension `dim` grown to `size` (zeros after the old entries): one copy."""
    shape = list(t.shape)
    shape[dim] = size
    grown = t.new_zeros(shape)
    grown.narrow(dim, 0, t.shape[dim]).copy_(t)
    return grown


# Up to this many rows attend through the fused kernel, more (a prompt's prefill) through torch's flash
# SDPA, whose GEMMs pay there. Every verify width stays on the kernel: its sums run in key order, one
# key at a time, so a row's attention is the same bits whatever the width, and with the per-row norm,
# RoPE and SwiGLU kernels and the packed linear (a fixed k order per row) the whole forward is batch-
# invariant: greedy speculation equals plain decoding exactly in bf16 too. Measured on an AMD EPYC
# (AVX-512-BF16, 2 threads; scripts/step_profile.py): the kernel beat SDPA at 5 rows (12.3 against 13.5
# ms), tied at 9 and lost at 17 (26.7 against 23.6 ms).
ATTEND_ROWS = 64


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm (in float32, weight applied after the cast back), one fused op."""
    return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)


def add_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, RMSNorm of it) over (T, H) rows: one fused kernel call where the kernels run
    (bf16 or float32 CPU inference; row by row, so batch-invariant), torch's ops otherwise and always
    in float64 (Hugging Face's norm runs in float32, and torch's reduction keeps logits equal to its
    to 1e-10)."""
    if x.dim() == 2 and x.dtype != torch.float64 and kernels.usable(x):
        s, normed = kernels.fused_ops().add_rms_norm(x.contiguous(), residual, weight, eps)
        return (x if residual is None else s), normed
    s = x if residual is None else x + residual
    return s, rms_norm(s, weight, eps)


def rope_tables(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, head_dim) cos and sin of RoPE at `positions` (n,), computed in float32 (whatever dtype a
    module's `inv_freq` buffer was cast to), cast to `dtype`."""
    freqs = positions[:, None].float() * inv_freq.to(positions.device, torch.float32)  # (n, d/2), as in HF
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last dimension of `x` (cos, sin broadcast against it)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass
class Block:
    """One decoder block's weights (norm weights as tensors, linears as callables) and shape.

    `qkv` holds the q, k and v linears (or one fused call), `gate_up` the MLP's gate and up (or one
    fused call) with `gate_up_sizes` their output widths; a block without an MLP (Kangaroo's
    adapter) has `down` None.
    """

    attn_norm: torch.Tensor
    qkv: list[Callable]
    wo: Callable
    mlp_norm: torch.Tensor | None
    gate_up: list[Callable]
    gate_up_sizes: list[int]
    down: Callable | None
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    # the described block (models/native.py's `describe`): all None / defaults for a Llama block
    style: BlockStyle = LLAMA
    q_norm: torch.Tensor | None = None  # (d,) RMSNorm of every query head before RoPE (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # norms of the attention's and the MLP's outputs (Gemma 2/3)
    post_mlp_norm: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None  # ((heads + 2 kv_heads) d,) added to the q/k/v projections (Qwen2)
    q_scale: float = 1.0  # queries times this: an attention scale other than 1/sqrt(d) (query_pre_attn_scalar)
    attn_softcap: float | None = None  # scores capped to (-c, c) by c * tanh(s / c) (Gemma 2): no SDPA then

    @property
    def plain(self) -> bool:
        """A Llama block (what the fused kernels compute)."""
        extras = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm, self.qkv_bias)
        return (
            self.style == LLAMA and self.q_scale == 1.0 and self.attn_softcap is None and all(e is None for e in extras)
        )

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (gemma_norm if self.style.norm == "gemma" else rms_norm)(x, weight, self.eps)

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
        at: int = 0,
        mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention over normed rows at positions with RoPE tables cos, sin (T, d), after the output
        projection, in the input's shape (with `rows`: only those rows, see `forward`).

        With `cache`: x is (T, H), one sequence; its keys and values are written at at..at+T of
        `layer` and the rows attend to [0, at + T) under `mask` ((T, at + T) bool; None: everything,
        e.g. one row). With a `batch_cache.BatchKVCache`: x is (B, T, H), `at` (B,) each row's start,
        cos and sin (B, T, d), and `mask` (B, 1, T, S) over the cache's span. Without a cache: x is
        (B, T, H) and the rows attend among themselves, causally unless `mask` ((B, 1, T, T)) is given."""
        qk_heads = self.heads + self.kv_heads
        y = self.qkv[0](x) if len(self.qkv) == 1 else torch.cat([f(x) for f in self.qkv], dim=-1)
        if self.qkv_bias is not None:
            y = y + self.qkv_bias
        y = y.unflatten(-1, (qk_heads + self.kv_heads, self.head_dim))  # (..., T, q+k+v heads, d)
        if cos.dtype != y.dtype:  # under autocast the linears' outputs are in the autocast dtype
            cos, sin = cos.to(y.dtype), sin.to(y.dtype)
        qk = y[..., :qk_heads, :]
        if self.q_norm is not None:  # per-head norms of queries and keys, before RoPE
            qk = torch.cat(
                (self.norm(qk[..., : self.heads, :], self.q_norm), self.norm(qk[..., self.heads :, :], self.k_norm)),
                dim=-2,
            )
        qk = rotate(qk, cos.unsqueeze(-2), sin.unsqueeze(-2))  # RoPE on q and k heads at once
        q = qk[..., : self.heads, :].transpose(-3, -2)  # (..., heads, T, d)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        k, v = qk[..., self.heads :, :].transpose(-3, -2), y[..., qk_heads:, :].transpose(-3, -2)
        if self.attn_softcap is not None:  # capped scores: the explicit product, as Hugging Face's eager path
            # (one sequence, or a batch: its keys and values over the span, under the batch's mask)
            keys, values = (k, v) if cache is None else cache.write(layer, at, k, v)
            out = capped_attention(q, keys, values, mask, self.attn_softcap)
        elif cache is None:
            causal = mask is None and q.shape[-2] > 1
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        else:  # the cache stores the new keys and values and reads its own (batch_cache: by row groups)
            out = cache.attend(layer, at, q, k, v, mask)  # ([B,] heads, T, d)
        out = out.transpose(-3, -2).flatten(-2)
        return self.wo(out if rows is None else out[rows])

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU (GeGLU with the tanh GELU for Gemma) over normed rows (..., H)."""
        gate, up = apply_rows(self.gate_up, self.gate_up_sizes, x)
        gate = F.gelu(gate, approximate="tanh") if self.style.act == "gelu_tanh" else F.silu(gate)
        return self.down(gate * up)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
        at: int = 0,
        mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The block over rows ((T, H) with a cache, (B, T, H) without: `attention`): x + attention(norm
        x), then + MLP(norm x) when it has one. `rows` (a bool mask over x's rows): every row gives
        its keys and values, but only these rows are computed on, returned flattened to (N, H)
        (training reads the outputs of the scored rows only)."""
        if rows is None and type(cache) is KVCache and self.down is not None and self._fusable(x, cache):
            return self._fused_forward(kernels.fused_ops(), x, cos, sin, cache, layer, at, mask)
        h = self.attention(self.norm(x, self.attn_norm), cos, sin, cache, layer, at, mask, rows)
        if self.post_attn_norm is not None:
            h = self.norm(h, self.post_attn_norm)
        x = (x if rows is None else x[rows]) + h
        if self.down is not None:
            m = self.mlp(self.norm(x, self.mlp_norm))
            x = x + (m if self.post_mlp_norm is None else self.norm(m, self.post_mlp_norm))
        return x

    def _fusable(self, x: torch.Tensor, cache: KVCache) -> bool:
        """The fused kernels run this block: (T, H) rows in the cache's dtype, CPU inference."""
        return self.plain and x.dim() == 2 and cache.k.dtype == x.dtype and kernels.usable(x)

    def _fused_forward(self, ops, x, cos, sin, cache: KVCache, layer: int, at: int, mask) -> torch.Tensor:
        """`forward` over (T, H) rows of one sequence with the fused kernels (models/kernels): the norm
        (with the residual add), RoPE with the cache write, attention and SwiGLU are one call each; the
        linears are the block's own. Same arithmetic as the torch path, rounding aside."""
        x = x.contiguous()
        _, h = add_norm(x, self.attn_norm, self.eps)
        y = self.qkv[0](h) if len(self.qkv) == 1 else torch.cat([f(h) for f in self.qkv], dim=-1)
        if cos.dtype != y.dtype:
            cos, sin = cos.to(y.dtype), sin.to(y.dtype)
        q = ops.rope_store(
            y.contiguous(), cos.contiguous(), sin.contiguous(), cache.k[layer], cache.v[layer], at,
            self.heads, self.kv_heads,
        )  # fmt: skip
        n = x.shape[0]
        if n <= ATTEND_ROWS:  # verify widths: one fused call, batch-invariant; a long prefill: flash SDPA
            out = ops.attend(q, cache.k[layer], cache.v[layer], at + n, mask)  # (T, heads * d)
        else:
            keys, values = cache.k[layer, :, : at + n], cache.v[layer, :, : at + n]
            q = q.transpose(0, 1)[None]  # (1, heads, T, d)
            out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)
            out = out[0].transpose(0, 1).flatten(1)
        x, h = add_norm(x, self.mlp_norm, self.eps, self.wo(out))
        if len(self.gate_up) == 1 and self.gate_up_sizes[0] == self.gate_up_sizes[1]:
            m = ops.silu_mul(self.gate_up[0](h).contiguous())
        else:
            gate, up = apply_rows(self.gate_up, self.gate_up_sizes, h)
            m = F.silu(gate) * up
        return x + self.down(m)


def causal_mask(t: int, at: int, device) -> torch.Tensor:
    """(t, at + t) bool: t new rows after `at` cached ones, each seeing the cache and its predecessors."""
    return torch.ones(t, at + t, dtype=torch.bool, device=device).tril(diagonal=at)
