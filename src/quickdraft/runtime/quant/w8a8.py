"""W8A8 linears: int8 weights in blocks of 32 inputs (a scale each, and optionally a min per 16) times
activations quantized the same way per row on the fly (llama.cpp's Q8_0 x Q8_0; with mins, its Q5_1 /
Q5_K / Q2_K x Q8 dot products), on quickdraft's fused kernels (`runtime/kernels/w8a8.h`:
`pack_int8`, `pack_blocks`, `linear_w8a8`, `linear_w8a8_min`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.quant.linear_base import QuantLinear, fused_ops
from quickdraft.runtime.quant.modes import W8A8_BLOCK


class W8A8Linear(QuantLinear):
    """y = x W^T with W int8 in blocks of 32 inputs (one scale per output and block), x quantized the
    same way per row on the fly (as llama.cpp's Q8_0 x Q8_0; `runtime/kernels`: `linear_w8a8`).

    Args:
        q: (out, in) int8 codes in [-127, 127].
        scales: (out, ceil(in / 32)) float32 block scales: W[o, k] = q[o, k] * scales[o, k // 32].
        mins: None, or (out, ceil(in / 16)) float32 mins per half-block: W[o, k] += mins[o, k // 16].
    """

    __slots__ = ("shape", "scales", "mins", "packed", "packed_scales", "_kernel")

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None = None) -> None:
        ops = fused_ops("--quantize w8a8")
        self.shape, self.scales = tuple(q.shape), scales.float().contiguous()
        self.mins = None if mins is None else mins.float().contiguous()
        if self.mins is not None and self.mins.shape != (self.shape[0], 2 * self.scales.shape[1]):
            raise QuickdraftError(f"w8a8 mins must be (out, 2 x blocks of 32), not {tuple(self.mins.shape)}")
        self.packed = ops.pack_int8(q.contiguous())  # (ceil(out/16), blocks * 8, 16, 4) uint8: q + 128
        # (ceil(out/16), blocks (+ 2 blocks of mins), 16): a tile's scales, then its mins
        values = self.scales if self.mins is None else torch.cat([self.scales, self.mins], dim=1)
        self.packed_scales = ops.pack_blocks(values)
        self._kernel = ops.linear_w8a8 if self.mins is None else ops.linear_w8a8_min

    @property
    def q(self) -> torch.Tensor:
        """(out, in) int8 codes, unpacked from `packed` (not kept beside it)."""
        nb, groups = self.packed.shape[:2]
        q = (self.packed.to(torch.int16) - 128).to(torch.int8).permute(0, 2, 1, 3).reshape(nb * 16, groups * 4)
        return q[: self.shape[0], : self.shape[1]].contiguous()

    def stored(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.packed_scales

    def rows(self, ids: torch.Tensor) -> W8A8Linear:
        return W8A8Linear(self.q[ids], self.scales[ids], None if self.mins is None else self.mins[ids])

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight the kernel computes with, q s (+ mn)."""
        w = self.q.float() * self.scales.repeat_interleave(W8A8_BLOCK, dim=1)[:, : self.shape[1]]
        if self.mins is not None:
            w += self.mins.repeat_interleave(W8A8_BLOCK // 2, dim=1)[:, : self.shape[1]]
        return w


CHUNK_ROWS = 4096  # rows quantized at a time: a 151,936-row LM head's float temporaries stay ~100 MB


def _w8a8_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (out, in) int8, scales (out, blocks)) of float rows, absmax / 127 per block of 32."""
    w = w.detach().float()
    out, k = w.shape
    blocks = -(-k // W8A8_BLOCK)
    padded = F.pad(w, (0, blocks * W8A8_BLOCK - k)).view(out, blocks, W8A8_BLOCK)
    scales = (padded.abs().amax(dim=-1) / 127).clamp_min(1e-12)
    q = torch.round(padded / scales[..., None]).clamp(-127, 127).to(torch.int8).view(out, -1)[:, :k]
    return q, scales


def w8a8_linear(weight: torch.Tensor) -> W8A8Linear:
    """Symmetric int8 of a float (out, in) weight in blocks of 32 inputs (absmax / 127 per block),
    CHUNK_ROWS rows at a time (rows are independent)."""
    parts = [_w8a8_codes(weight[i : i + CHUNK_ROWS]) for i in range(0, weight.shape[0], CHUNK_ROWS)]
    return W8A8Linear(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
