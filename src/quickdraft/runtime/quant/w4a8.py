"""4-bit weights times int8 activations (`--quantize w4a8`): llama.cpp's Q4_1 x Q8_1 on VNNI.

A weight is w = q d + m, q a code 0..15, with one fp16 scale d and min m per output and block of 32
inputs: exactly a GGUF's Q4_1 block (Q4_0's: m = -8 d), so the embedded default's layers run on their
own 4-bit blocks with no round trip (`runtime/quant/formats/q4_0.py`); other models' float32 weights get min-max
blocks (`w4a8_linear`). Activations are quantized per row and block of 32 on the fly (absmax / 127),
as w8a8's. The kernel (`runtime/kernels/fused.cpp`: `pack_q4`, `linear_w4a8`) streams 5 bits a weight
(codes, then the block's d and m) and multiplies 64 code-activation pairs a vpdpbusd; a row's result
does not depend on the rows beside it (integer sums per block, then one float order), so a verify row
is the same bits as the row decoded alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quickdraft.runtime.quant.linear_base import QuantLinear, fused_ops

BLOCK = 32  # inputs per block of codes (and of the activations' scales)


class W4A8Linear(QuantLinear):
    """y = x W^T with W[o, k] = q[o, k] d[o, k // 32] + m[o, k // 32] and x quantized per row and block.

    Args:
        codes: (out, in) uint8 codes 0..15.
        d, m: (out, ceil(in / 32)) float scales and mins (held in fp16, as a GGUF holds them).
    """

    __slots__ = ("shape", "d", "m", "packed", "_kernel")

    def __init__(self, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> None:
        ops = fused_ops("--quantize w4a8")
        self.shape = tuple(codes.shape)
        self.d, self.m = d.half().float().contiguous(), m.half().float().contiguous()
        self.packed = ops.pack_q4(codes.to(torch.uint8).contiguous(), self.d, self.m)  # (ceil(out/16), blocks, 320)
        self._kernel = ops.linear_w4a8

    @property
    def codes(self) -> torch.Tensor:
        """(out, in) uint8 codes, unpacked from `packed` (not kept: a byte a weight beside its 5 bits)."""
        return unpack_q4(self.packed, *self.shape)

    def rows(self, ids: torch.Tensor) -> W4A8Linear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        return W4A8Linear(self.codes[ids], self.d[ids], self.m[ids])

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight the kernel computes with."""
        out, k = self.shape
        blocks = self.d.shape[1]
        q = F.pad(self.codes.float(), (0, blocks * BLOCK - k)).view(out, blocks, BLOCK)
        return (q * self.d[..., None] + self.m[..., None]).view(out, -1)[:, :k]


def unpack_q4(packed: torch.Tensor, out: int, k: int) -> torch.Tensor:
    """`pack_q4`'s (out/16, blocks, 320) bytes back to (out, k) uint8 codes: byte 64 j + 4 o + i of a
    block holds output o's code 4 j + i in its low nibble and code 16 + 4 j + i in its high one."""
    nb, blocks = packed.shape[:2]
    quads = packed[:, :, :256].reshape(nb, blocks, 4, 16, 4).permute(0, 3, 1, 2, 4)  # (nb, o, b, j, i)
    lo, hi = (quads & 0x0F).reshape(nb, 16, blocks, 16), (quads >> 4).reshape(nb, 16, blocks, 16)
    return torch.cat([lo, hi], dim=-1).reshape(nb * 16, blocks * BLOCK)[:out, :k].contiguous()


CHUNK_ROWS = 4096  # rows quantized at a time: a large LM head's float temporaries stay small


def w4a8_linear(weight: torch.Tensor) -> W4A8Linear:
    """Min-max 4-bit blocks of 32 inputs of a float (out, in) weight: each block's 16 levels span
    [min, max] (a weight already on a 4-bit grid, e.g. a dequantized Q4_1 block, lands back on it up to
    the fp16 rounding of d and m); CHUNK_ROWS rows at a time (rows are independent)."""
    parts = [_min_max(weight[i : i + CHUNK_ROWS]) for i in range(0, weight.shape[0], CHUNK_ROWS)]
    return W4A8Linear(*(torch.cat([p[j] for p in parts]) for j in range(3)))


def _min_max(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, d, m) of min-max 4-bit blocks of 32 over float rows."""
    w = weight.detach().float()
    out, k = w.shape
    blocks = -(-k // BLOCK)
    padded = F.pad(w, (0, blocks * BLOCK - k)).view(out, blocks, BLOCK)
    if k % BLOCK:  # the padding must not widen the last block's range
        last = padded[:, -1, : k % BLOCK]
        padded[:, -1, k % BLOCK :] = last[:, :1]
    lo, hi = padded.amin(-1), padded.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-8).half().float()
    m = lo.half().float()
    q = torch.round((padded - m[..., None]) / d[..., None]).clamp(0, 15).to(torch.uint8).view(out, -1)[:, :k]
    return q, d, m


def concat(parts: list[W4A8Linear]) -> W4A8Linear:
    """One linear over the parts' concatenated output rows."""
    return W4A8Linear(*(torch.cat([getattr(p, n) for p in parts]) for n in ("codes", "d", "m")))
