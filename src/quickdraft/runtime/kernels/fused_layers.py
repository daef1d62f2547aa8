"""A run of plain Llama blocks as one C++ call (`kernels/fused.cpp`: `llama_layers`).

`llama_block.Block._fused_forward` calls the fused kernels one by one from Python; on a small model
the Python between them is a real share of the step (SmolLM2-135M with w4a8 weights, measured:
docs/benchmarks.md). `LayerKernels` hands the whole run of layers to one
call that does the same kernels in the same order, so a forward through it is the same bits as
through the Python path (tested). It runs where every layer of the run is a plain Llama block (or Qwen2's: q/k/v biases)
whose linears are kernel forms: our packed bf16 (`runtime/kernels/linear.py`, the "fused" kind), w8a8 or
w4a8 (`weights/`); otherwise, or for more rows than the attention kernel takes, the Python path runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.kernels.attention import ATTEND_ROWS
from quickdraft.runtime.kernels.linear import Linear, PackedRows
from quickdraft.runtime.quant.q4k import Q4KLinear
from quickdraft.runtime.quant.w4a8 import W4A8Linear
from quickdraft.runtime.quant.w6a8 import W6A8Linear
from quickdraft.runtime.quant.w8a8 import W8A8Linear

if TYPE_CHECKING:  # the blocks are read by their attributes
    from quickdraft.runtime.forward.llama_block import Block

_NONE = torch.empty(0)


def kernel_form(lin) -> tuple[int, torch.Tensor, torch.Tensor, int] | None:
    """(kind, packed, scales or an empty tensor, out features) of a linear `llama_layers` runs, or None."""
    if isinstance(lin, Linear) and lin.kind == "fused" and lin.packed is not None:
        return 0, lin.packed, _NONE, lin.weight.shape[0]
    if isinstance(lin, PackedRows) and lin.kind == "fused":
        return 0, lin.packed, _NONE, lin.out
    if isinstance(lin, W8A8Linear):  # with mins (kind 5), the packed scales hold them after the scales
        return 1 if lin.mins is None else 5, lin.packed, lin.packed_scales, lin.out_features
    if isinstance(lin, W4A8Linear):
        return 2, lin.packed, _NONE, lin.out_features
    if isinstance(lin, W6A8Linear):
        return 3, lin.packed, _NONE, lin.out_features
    if isinstance(lin, Q4KLinear):
        return 4, lin.packed, _NONE, lin.out_features
    return None


def _layer_args(block: Block) -> tuple | None:
    """(norms, [(kind, a, b, out)] for the q|k|v parts (1 to 3), o, gate|up and down, q/k/v bias or an
    empty tensor) of a block the call runs, or None: a Llama block, or one whose only addition is
    Qwen2's q/k/v bias. q, k and v may stay apart (kinds that do not concatenate: a Q4_K_M file's Q6_K v
    beside Q4_K q and k); gate and up must be one linear (the call's gated activation takes both)."""
    if not block.llama_with_bias or block.down is None or len(block.gate_up) != 1:
        return None
    if block.gate_up_sizes[0] != block.gate_up_sizes[1]:
        return None
    forms = [kernel_form(f) for f in (*block.qkv, block.wo, block.gate_up[0], block.down)]
    if any(f is None for f in forms):
        return None
    return (block.attn_norm, block.mlp_norm), forms, (_NONE if block.qkv_bias is None else block.qkv_bias.contiguous())


class LayerKernels:
    """The arguments of `llama_layers` for a model's blocks, built once.

    Args:
        layers: the model's blocks.
        windows: each layer's sliding window (0: none); a windowed layer runs in Python.
        rope_keys: each layer's RoPE table (a run takes one table: layers of several run in Python).
    """

    def __init__(self, layers: list[Block], windows: list[int], rope_keys: list[str]) -> None:
        self.layers = [None if w else _layer_args(b) for b, w in zip(layers, windows, strict=True)]
        self.rope_keys = rope_keys
        first = layers[0] if layers else None
        self.shape = (first.heads, first.kv_heads, first.eps) if first is not None else None
        self._runs: dict[tuple[int, int], tuple] = {}

    def runs(self, x: torch.Tensor, cache: KVCache, start: int, stop: int) -> bool:
        """Whether layers [start, stop) over rows x (T, H) of `cache` go through the one call."""
        return (
            type(cache) is KVCache
            and x.dim() == 2
            and x.shape[0] <= ATTEND_ROWS
            and cache.k.dtype == x.dtype
            and all(self.layers[i] is not None for i in range(start, stop))
            and len(set(self.rope_keys[start:stop])) == 1
            and kernels.usable(x)
        )

    def _args(self, start: int, stop: int) -> tuple:
        key = (start, stop)
        if key not in self._runs:
            norms, kinds, wa, wb, outs, parts, biases = [], [], [], [], [], [], []
            for i in range(start, stop):
                (attn, mlp), forms, bias = self.layers[i]
                norms += [attn, mlp]
                parts.append(len(forms) - 3)
                biases.append(bias)
                for kind, a, b, out in forms:
                    kinds.append(kind), wa.append(a), wb.append(b), outs.append(out)
            self._runs[key] = (norms, kinds, wa, wb, outs, parts, biases)
        return self._runs[key]

    def __call__(self, x: torch.Tensor, cache: KVCache, start: int, stop: int, at: int, cos, sin, mask) -> torch.Tensor:
        """Layers [start, stop) over x (T, H) written at cache positions at..at+T; cos, sin (T, d);
        mask (T, at + T) bool or None -> (T, H)."""
        if start == stop:
            return x
        heads, kv_heads, eps = self.shape
        cos, sin = cos.to(x.dtype).contiguous(), sin.to(x.dtype).contiguous()
        return kernels.fused_ops().llama_layers(
            x, *self._args(start, stop), cache.k, cache.v, start, at, cos, sin, mask, heads, kv_heads, eps
        )
