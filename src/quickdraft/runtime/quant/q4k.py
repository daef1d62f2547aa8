"""A GGUF's Q4_K weights run as stored, times int8 activations (under `--quantize w4a8`).

Q4_K holds w = d sc_b q - dmin mn_b: a code q in 0..15, 6-bit integers sc_b and mn_b per output and
block of 32 inputs, fp16 d and dmin per output and 256 inputs. The kernel (`runtime/kernels/q4k.h`:
`pack_q4k`, `linear_q4k`) streams 4.625 bits a weight and computes with d sc_b and dmin mn_b exactly (in
float32), where the w4a8 blocks it replaces stream 5 and round each to fp16. Activations are quantized per
row and block of 32 on the fly, as w4a8's; a row's result does not depend on the rows beside it.
"""

from __future__ import annotations

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.quant.linear_base import QuantLinear, fused_ops, gguf_shape

SUPER = 256  # inputs per d and dmin
BLOCK = 32  # inputs per sc and mn
NAMES = ("codes", "sc", "mn", "d", "dmin")


class Q4KLinear(QuantLinear):
    """y = x W^T with W[o, k] = d[o, k // 256] sc[o, k // 32] q[o, k] - dmin[o, k // 256] mn[o, k // 32].

    Args:
        codes: (out, in) uint8 codes 0..15, in a multiple of 256.
        sc, mn: (out, in / 32) uint8 6-bit scales and mins.
        d, dmin: (out, in / 256) float (held in fp16, as a GGUF holds them).
    """

    __slots__ = ("shape", "packed", "_kernel")

    def __init__(self, codes, sc, mn, d, dmin) -> None:
        ops = _ops()
        if codes.dim() != 2 or codes.shape[1] % SUPER:
            shape = tuple(codes.shape)
            raise QuickdraftError(f"Q4_K codes must be (out, in) with in a multiple of {SUPER}, not {shape}")
        self.shape = tuple(codes.shape)
        u8 = [t.to(torch.uint8).contiguous() for t in (codes, sc, mn)]
        self.packed = ops.pack_q4k(*u8, *(t.float().half().float().contiguous() for t in (d, dmin)))
        self._kernel = ops.linear_q4k

    @classmethod
    def from_gguf(cls, raw: torch.Tensor) -> Q4KLinear:
        """The linear of a GGUF Q4_K tensor's rows as stored, (out, in / 256 * 144) uint8, packed in one pass
        (the same bytes as the constructor's from `formats.q4_k.q4_k_parts`)."""
        ops = _ops()
        shape = gguf_shape(raw, "Q4_K", 144, SUPER)
        return cls.of_packed(shape, ops.pack_q4k_gguf(raw.contiguous()), ops.linear_q4k)

    def parts(self) -> tuple[torch.Tensor, ...]:
        """(codes, sc, mn, d, dmin) as the constructor takes them, unpacked from `packed` (nb, K/256, 2368)."""
        out, k = self.shape
        p = self.packed
        nb, supers = p.shape[:2]
        halves = p[:, :, :64].contiguous().view(torch.float16).float().view(nb, supers, 2, 16).permute(2, 0, 3, 1)
        d, dmin = (h.reshape(nb * 16, supers)[:out] for h in halves)
        ints = p[:, :, 64:320].reshape(nb, supers, 2, 8, 16).permute(2, 0, 4, 1, 3)  # (sc|mn, nb, o, super, block)
        sc, mn = (t.reshape(nb * 16, supers * 8)[:out] for t in ints)
        quads = p[:, :, 320:].reshape(nb, supers, 8, 4, 16, 4).permute(0, 4, 1, 2, 3, 5)  # (nb, o, s, c, j, i)
        lo, hi = quads & 0x0F, quads >> 4
        codes = torch.cat([lo.reshape(nb, 16, supers, 8, 16), hi.reshape(nb, 16, supers, 8, 16)], dim=-1)
        codes = codes.reshape(nb * 16, supers * SUPER)[:out, :k]
        return tuple(t.contiguous() for t in (codes, sc, mn, d, dmin))

    def rows(self, ids: torch.Tensor) -> Q4KLinear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        return Q4KLinear(*(t[ids] for t in self.parts()))

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight the kernel computes with."""
        codes, sc, mn, d, dmin = self.parts()
        per = SUPER // BLOCK
        scale = d.repeat_interleave(per, dim=1) * sc.float()
        low = dmin.repeat_interleave(per, dim=1) * mn.float()
        return scale.repeat_interleave(BLOCK, dim=1) * codes.float() - low.repeat_interleave(BLOCK, dim=1)


def _ops():
    return fused_ops("Q4_K weights")


def concat(parts: list[Q4KLinear]) -> Q4KLinear:
    """One linear over the parts' concatenated output rows: their packed tiles joined as they are when
    each part fills whole tiles of 16 outputs, else packed again from their parts."""
    if all(p.shape[0] % 16 == 0 for p in parts):
        shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        return Q4KLinear.of_packed(shape, torch.cat([p.packed for p in parts]), _ops().linear_q4k)
    unpacked = [p.parts() for p in parts]
    return Q4KLinear(*(torch.cat([u[i] for u in unpacked]) for i in range(len(NAMES))))
