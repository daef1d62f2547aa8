"""A GGUF's Q6_K weights run as stored, times int8 activations (under `--quantize w4a8` / `gguf`).

Q6_K holds w = d sc_j (q - 32): a code q in 0..63, an int8 scale sc_j per output and 16 inputs, an fp16
scale d per output and 256 inputs. The kernel (`runtime/kernels/w6a8.h`: `pack_q6`, `linear_w6a8`)
streams 7 bits a weight (the codes' 6, then each block's scales), where the 8-bit re-rounding it replaces
streamed 9 and changed the values; activations are quantized per row and block of 32 on the fly, as
w4a8's and w8a8's. A row's result does not depend on the rows beside it (integer sums per half-block,
then one float order), so a verify row is the same bits as the row decoded alone.
"""

from __future__ import annotations

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.quant.linear_base import QuantLinear, fused_ops, gguf_shape

SUPER = 256  # inputs per d


class W6A8Linear(QuantLinear):
    """y = x W^T with W[o, k] = d[o, k // 256] sc[o, k // 16] (q[o, k] - 32), x quantized per row and block.

    Args:
        codes: (out, in) uint8 codes 0..63, in a multiple of 256.
        sc: (out, in / 16) int8 scales.
        d: (out, in / 256) float scales (held in fp16, as a GGUF holds them).
    """

    __slots__ = ("shape", "packed", "_kernel")

    def __init__(self, codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> None:
        ops = _ops()
        if codes.dim() != 2 or codes.shape[1] % SUPER:
            shape = tuple(codes.shape)
            raise QuickdraftError(f"Q6_K codes must be (out, in) with in a multiple of {SUPER}, not {shape}")
        self.shape = tuple(codes.shape)
        d = d.float().half().float().contiguous()
        self.packed = ops.pack_q6(codes.to(torch.uint8).contiguous(), sc.to(torch.int8).contiguous(), d)
        self._kernel = ops.linear_w6a8

    @classmethod
    def from_gguf(cls, raw: torch.Tensor) -> W6A8Linear:
        """The linear of a GGUF Q6_K tensor's rows as stored, (out, in / 256 * 210) uint8, packed in one pass
        (the same bytes as the constructor's from `formats.q6_k.q6_k_blocks`)."""
        ops = _ops()
        shape = gguf_shape(raw, "Q6_K", 210, SUPER)
        return cls.of_packed(shape, ops.pack_q6_gguf(raw.contiguous()), ops.linear_w6a8)

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes (out, in) uint8, sc (out, in/16) int8, d (out, in/256) float), unpacked from `packed`."""
        out, k = self.shape
        p = self.packed  # (nb, blocks, 448)
        nb, blocks = p.shape[:2]
        quads = p[:, :, :256].reshape(nb, blocks, 4, 16, 4).permute(0, 3, 1, 2, 4)  # (nb, o, b, j, i)
        highs = p[:, :, 256:384].reshape(nb, blocks, 2, 16, 4).permute(0, 3, 1, 2, 4)  # (nb, o, b, half, i)
        shift = (2 * torch.arange(4, dtype=torch.uint8)).view(1, 1, 1, 4, 1)
        lo = (quads & 0x0F) | (((highs[:, :, :, :1] >> shift) & 3) << 4)
        hi = (quads >> 4) | (((highs[:, :, :, 1:] >> shift) & 3) << 4)
        codes = torch.cat([lo.reshape(nb, 16, blocks, 16), hi.reshape(nb, 16, blocks, 16)], dim=-1)
        codes = codes.reshape(nb * 16, blocks * 32)[:out, :k]
        sc = p[:, :, 384:416].view(torch.int8).reshape(nb, blocks, 2, 16).permute(0, 3, 1, 2).reshape(nb * 16, -1)
        d = p[:, ::8, 416:448].contiguous().view(torch.float16).permute(0, 2, 1).reshape(nb * 16, -1)
        return codes.contiguous(), sc[:out].contiguous(), d[:out].float().contiguous()

    def rows(self, ids: torch.Tensor) -> W6A8Linear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        codes, sc, d = self.parts()
        return W6A8Linear(codes[ids], sc[ids], d[ids])

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight the kernel computes with, (d sc) (q - 32)."""
        return q6_k_weights(*self.parts())


def q6_k_weights(codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(out, in) float32 of Q6_K's parts (codes (out, in) 0..63, sc (out, in / 16), d (out, in / 256)):
    w = (d sc) (q - 32), the GGUF's dequantized values."""
    scale = d.repeat_interleave(16, dim=1) * sc.float()
    return scale.repeat_interleave(16, dim=1) * (codes.float() - 32)


def _ops():
    return fused_ops("Q6_K weights")
