"""The weight-only int8 and int4 linears on PyTorch's own CPU kernels (`--quantize int8`, `int4[:G]`, and
`gguf`'s forms): int8 per output channel (`aten._weight_int8pack_mm`) and int4 groups of 32 or 64 along the
input (`aten._weight_int4pack_mm_for_cpu`). Both on `linear_base.QuantLinear`, as every quantized linear."""

from __future__ import annotations

import torch

from quickdraft.runtime.quant.linear_base import QuantLinear
from quickdraft.runtime.quant.modes import check_group


class Int8Linear(QuantLinear):
    """y = x (q * s)^T with q (out, in) int8 and s (out,) per output channel."""

    __slots__ = ("shape", "q", "scales", "_cast")

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        self.q, self.scales = q.contiguous(), scales.float().contiguous()
        self.shape = tuple(q.shape)
        self._cast: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out) in x's dtype."""
        s = self._cast.get(x.dtype)
        if s is None:
            s = self._cast.setdefault(x.dtype, self.scales.to(x.dtype))
        return torch.ops.aten._weight_int8pack_mm(x, self.q, s)

    def rows(self, ids: torch.Tensor) -> Int8Linear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        return Int8Linear(self.q[ids], self.scales[ids])

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scales[:, None]

    def stored(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.scales


class Int4Linear(QuantLinear):
    """y = x W^T with W[o, g*G + j] = (q[o, g*G + j] - 8) * scale[o, g] + zero[o, g], q in 0..15.

    Args:
        q: (out, in) integer codes 0..15.
        scale, zero: (out, in / group) float32.
        group: 32 or 64.
    """

    __slots__ = ("shape", "packed", "scale", "zero", "group", "codes", "_cast")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> None:
        out, k = q.shape
        check_group(group, k)
        self.shape = (out, k)
        self.codes = q.to(torch.uint8)  # kept for rows(), joins and dequantized(): a byte per weight, off the hot path
        pad = -out % 16  # the packing takes rows in sixteens: zero rows, cut from the output
        codes = torch.cat([q.to(torch.int32), q.new_zeros(pad, k, dtype=torch.int32)]) if pad else q.to(torch.int32)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
        self.scale, self.zero, self.group = scale.float(), zero.float(), group
        self._cast: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out) in x's dtype."""
        sz = self._cast.get(x.dtype)
        if sz is None:  # (in / group, out padded to 16, 2) in the activation dtype, as the kernel reads it
            sz = torch.stack([self.scale.t(), self.zero.t()], dim=-1)
            pad = self.packed.shape[0] - sz.shape[1]
            sz = torch.cat([sz, sz.new_zeros(sz.shape[0], pad, 2)], dim=1) if pad else sz
            sz = self._cast.setdefault(x.dtype, sz.to(x.dtype).contiguous())
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, sz)
        return y if y.shape[1] == self.codes.shape[0] else y[:, : self.codes.shape[0]]

    def rows(self, ids: torch.Tensor) -> Int4Linear:
        return Int4Linear(self.codes[ids], self.scale[ids], self.zero[ids], self.group)

    def dequantized(self) -> torch.Tensor:
        out, k = self.codes.shape
        q = self.codes.float().view(out, k // self.group, self.group) - 8
        return (q * self.scale[..., None] + self.zero[..., None]).view(out, k)

    def stored(self) -> tuple[torch.Tensor, ...]:  # `codes` stays off the hot path: not counted
        return self.packed, self.scale, self.zero


def int8_linear(weight: torch.Tensor) -> Int8Linear:
    """Symmetric per-output-channel int8 of a float32 (out, in) weight (absmax / 127)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Linear(q, scales)


def int4_linear(weight: torch.Tensor, group: int = 32) -> Int4Linear:
    """Min-max int4 groups of `group` along the input of a float32 (out, in) weight: each group's
    16 levels span [min, max] (weights already on a 4-bit grid, e.g. a dequantized Q4_1 block, land
    back on it up to float32 rounding)."""
    w = weight.detach().float()
    out, k = w.shape
    check_group(group, k)
    blocks = w.view(out, k // group, group)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((blocks - lo[..., None]) / scale[..., None]).clamp(0, 15).view(out, k)
    return Int4Linear(q, scale, lo + 8 * scale, group)
