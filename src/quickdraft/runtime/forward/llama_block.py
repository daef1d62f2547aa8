"""One Llama decoder block and one KV cache, shared by the native target (`native.py`) and the draft
modules that reuse its shape (`draft_heads.py`: the feature head, Kangaroo's adapter, SpecDec's block
drafter).

The arithmetic is Hugging Face's, in its order and dtypes (RMSNorm in float32 with the weight applied
after the cast back, RoPE tables in float32 cast to the activations' dtype, SDPA attention with
grouped-query heads), so the native target's logits equal Hugging Face's to rounding (1e-10 in
float64). A block's linears are callables (plain, packed bf16, int8 or int4 kernels: `linear.py`,
`quant.py`, or a module's own `nn.Linear`), and q/k/v (gate/up) may be one fused call.

The block's KV cache is `static_cache.KVCache`. Over one sequence the block runs the fused kernels
(`kernels/fused.cpp`: norms, RoPE with the cache write, attention, the gated activations), the
described blocks too (Gemma's 1+w norms, q/k norms, sandwich norms, GeGLU, the attention scale).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.batch_cache import BatchKVCache
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.forward.block_parts import LLAMA, BlockStyle, capped_attention, gemma_norm, rms_norm, rotate
from quickdraft.runtime.kernels import block_ops
from quickdraft.runtime.kernels.attention import ATTEND_ROWS, attend, long_attention
from quickdraft.runtime.kernels.batch_attention import attend_batch
from quickdraft.runtime.kernels.linear import apply_rows


def add_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, RMSNorm of it) over (T, H) rows: one fused kernel call where the kernels run
    (bf16 or float32 CPU inference; row by row, so batch-invariant), torch's ops otherwise and always
    in float64 (Hugging Face's norm runs in float32, and torch's reduction keeps logits equal to its
    to 1e-10)."""
    if x.dim() == 2 and x.dtype != torch.float64 and kernels.usable(x):
        s, normed = block_ops.add_rms_norm(x.contiguous(), residual, weight, eps)
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
    # the described block (runtime/forward/native.py's `describe`): all None / defaults for a Llama block
    style: BlockStyle = LLAMA
    q_norm: torch.Tensor | None = None  # (d,) RMSNorm of every query head before RoPE (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # norms of the attention's and the MLP's outputs (Gemma 2/3)
    post_mlp_norm: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None  # ((heads + 2 kv_heads) d,) added to the q/k/v projections (Qwen2)
    q_scale: float = 1.0  # queries times this: an attention scale other than 1/sqrt(d) (query_pre_attn_scalar)
    attn_softcap: float | None = None  # scores capped to (-c, c) by c * tanh(s / c) (Gemma 2): no SDPA then
    _knorms: dict | None = field(default=None, repr=False)  # the kernels' norm weights (`_kernel_norms`)

    @property
    def plain(self) -> bool:
        """A Llama block (what the fused kernels compute)."""
        return self.llama_with_bias and self.qkv_bias is None

    @property
    def llama_with_bias(self) -> bool:
        """A Llama block, or one whose only addition is Qwen2's q/k/v bias (the one-call layer kernel's)."""
        extras = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm, self.attn_softcap)
        return self.style == LLAMA and self.q_scale == 1.0 and all(e is None for e in extras)

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
        if rows is None and self.down is not None and cache is not None and self._fusable(x, cache):
            if type(cache) is KVCache and x.dim() == 2:
                one = functools.partial(self._attend, cache.k[layer], cache.v[layer], at, mask)
                return self._fused_forward(x, cos, sin, one)
            if type(cache) is BatchKVCache and x.dim() == 3 and x.shape[1] <= ATTEND_ROWS:
                return self._fused_batch_forward(x, cos, sin, cache, layer, at, mask)
        h = self.attention(self.norm(x, self.attn_norm), cos, sin, cache, layer, at, mask, rows)
        if self.post_attn_norm is not None:
            h = self.norm(h, self.post_attn_norm)
        x = (x if rows is None else x[rows]) + h
        if self.down is not None:
            m = self.mlp(self.norm(x, self.mlp_norm))
            x = x + (m if self.post_mlp_norm is None else self.norm(m, self.post_mlp_norm))
        return x

    def _fusable(self, x: torch.Tensor, cache: KVCache) -> bool:
        """The fused kernels run this block: rows in the cache's dtype, CPU inference, a Llama block, or
        a described one whose scores are not capped outside float64 (the reference dtype: there its
        torch path keeps Hugging Face's arithmetic, float32 Gemma norms included)."""
        described = self.attn_softcap is None and x.dtype != torch.float64
        return (self.plain or described) and cache.k.dtype == x.dtype and kernels.usable(x)

    def _kernel_norms(self) -> dict[str, torch.Tensor]:
        """The norm weights as the RMSNorm kernel multiplies them: Gemma's 1 + w folded in once."""
        if self._knorms is None:
            names = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")
            gemma = self.style.norm == "gemma"
            weights = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
            self._knorms = {n: ((1.0 + w.float()).to(w.dtype) if gemma else w).contiguous() for n, w in weights.items()}
        return self._knorms

    def _fused_forward(self, x, cos, sin, attend: Callable) -> torch.Tensor:
        """`forward` over (T, H) rows with the fused kernels (runtime/kernels): the norms (with the
        residual add), RoPE with the cache write, attention and the gated activation are one call
        each; the linears are the block's own. A described block adds its parts between them (q/k/v
        biases, per-head q/k norms, the attention scale, the sandwich norms, GeGLU). Same arithmetic
        as the torch path, rounding aside; row by row, so batch-invariant. `attend(y, cos, sin)`
        runs RoPE, the cache write and attention of the fused q|k|v rows: one sequence's (`_attend`),
        or each row of a batch over its own cache (`_fused_batch_forward`)."""
        norms, eps, n = self._kernel_norms(), self.eps, x.shape[0]
        x = x.contiguous()
        _, h = add_norm(x, norms["attn_norm"], eps)
        y = self.qkv[0](h) if len(self.qkv) == 1 else torch.cat([f(h) for f in self.qkv], dim=-1)
        if self.qkv_bias is not None:
            y = y + self.qkv_bias
        if self.q_norm is not None:  # per-head RMSNorm of queries and keys, before RoPE
            qd, kd, d = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
            q_rows = block_ops.add_rms_norm(y[:, :qd].reshape(-1, d).contiguous(), None, norms["q_norm"], eps)[1]
            k_rows = block_ops.add_rms_norm(y[:, qd : qd + kd].reshape(-1, d).contiguous(), None, norms["k_norm"], eps)[
                1
            ]
            y = torch.cat([q_rows.view(n, qd), k_rows.view(n, kd), y[:, qd + kd :]], dim=1)
        if cos.dtype != y.dtype:
            cos, sin = cos.to(y.dtype), sin.to(y.dtype)
        out = attend(y, cos, sin)  # (T, heads * d)
        o = self.wo(out)
        if self.post_attn_norm is not None:
            o = block_ops.add_rms_norm(o.contiguous(), None, norms["post_attn_norm"], eps)[1]
        x, h = add_norm(x, norms["mlp_norm"], eps, o)
        gelu = self.style.act == "gelu_tanh"
        if len(self.gate_up) == 1 and self.gate_up_sizes[0] == self.gate_up_sizes[1]:
            m = block_ops.gated_mul(self.gate_up[0](h).contiguous(), gelu)
        else:
            gate, up = apply_rows(self.gate_up, self.gate_up_sizes, h)
            m = (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up
        m = self.down(m)
        if self.post_mlp_norm is not None:
            m = block_ops.add_rms_norm(m.contiguous(), None, norms["post_mlp_norm"], eps)[1]
        return x + m

    def _attend(self, k_cache, v_cache, at: int, mask, y, cos, sin) -> torch.Tensor:
        """RoPE and the cache write of one sequence's fused q|k|v rows y (T, width) at positions
        at..at+T of a layer's (kv, capacity, d) cache, then their attention: (T, heads * d)."""
        q = block_ops.rope_store(
            y.contiguous(), cos.contiguous(), sin.contiguous(), k_cache, v_cache, at, self.heads, self.kv_heads
        )
        if self.q_scale != 1.0:
            q = (q * self.q_scale).contiguous()
        n = y.shape[0]
        if n <= ATTEND_ROWS or long_attention(q.dtype, self.head_dim, at + n):
            # verify widths: one fused call, batch-invariant; a long prefill too where the kernel's vector
            # path runs (a prefill row is then the same bits as the row decoded alone); else flash SDPA
            return attend(q, k_cache, v_cache, at + n, mask)
        keys, values = k_cache[:, : at + n], v_cache[:, : at + n]
        q = q.transpose(0, 1)[None]  # (1, heads, T, d)
        out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1).flatten(1)

    def _fused_batch_forward(self, x, cos, sin, cache: BatchKVCache, layer: int, starts, mask) -> torch.Tensor:
        """`forward` over a batch's (B, T, H) rows with the fused kernels: the norms, linears and
        activations over all B x T rows at once, RoPE, the cache write and attention of every row over
        its own cache row under its mask ((B, 1, T, span)) in one call (`attend_batch`; a scaled query,
        Gemma's, row by row). Every kernel is batch-invariant, so a row's outputs are the same bits as
        the same rows decoded alone (`_fused_forward`)."""
        b, t, hidden = x.shape
        if self.q_scale == 1.0:

            def attend_rows(y, cos_rows, sin_rows):
                k, v, m = cache.k[layer], cache.v[layer], mask[:, 0].contiguous()
                cos_rows, sin_rows = cos_rows.contiguous(), sin_rows.contiguous()
                return attend_batch(y, cos_rows, sin_rows, k, v, starts, m, self.heads, self.kv_heads)

        else:
            at = [int(a) for a in starts.tolist()]

            def attend_rows(y, cos_rows, sin_rows):
                return torch.cat([
                    self._attend(
                        cache.k[layer, i], cache.v[layer, i], at[i], mask[i, 0, :, : at[i] + t],
                        y[i * t : (i + 1) * t], cos_rows[i * t : (i + 1) * t], sin_rows[i * t : (i + 1) * t],
                    )
                    for i in range(b)
                ])  # fmt: skip

        flat = self._fused_forward(
            x.reshape(b * t, hidden), cos.reshape(b * t, -1), sin.reshape(b * t, -1), attend_rows
        )
        return flat.view(b, t, hidden)


def causal_mask(t: int, at: int, device) -> torch.Tensor:
    """(t, at + t) bool: t new rows after `at` cached ones, each seeing the cache and its predecessors."""
    return torch.ones(t, at + t, dtype=torch.bool, device=device).tril(diagonal=at)
