"""GGUF Q5_K as stored: super-blocks of 256 weights, fp16 d and dmin, 6-bit sc_j and m_j per 32 (Q4_K's
packing), 5-bit codes (nibbles plus a bit plane): w = d sc_j q - dmin m_j. Runs as w8a8 with mins: codes
0..31, scale d sc_j and min -dmin m_j (exact in float32: an fp16 times a 6-bit integer), times int8
activations (llama.cpp's Q5_K x Q8_K)."""

from __future__ import annotations

import numpy as np
import torch
from gguf.quants import Q4_K

from quickdraft.runtime.quant.formats.base import Format, bits, codes_of, fp16, nibbles, per_output
from quickdraft.runtime.quant.w8a8 import W8A8Linear


def linear(rows: torch.Tensor) -> W8A8Linear:
    """rows (out, super-blocks * 176) uint8 -> W8A8Linear(q, d sc, -dmin m) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    d, dmin, qh, qs = fp16(b[:, :2]), fp16(b[:, 2:4]), b[:, 16:48], b[:, 48:]
    sc, mn = Q4_K.get_scale_min(b[:, 4:16])
    q = nibbles(qs, 32).reshape(-1, 8, 32) | (bits(qh) << np.uint8(4))
    mins = np.repeat(-(dmin * mn.astype(np.float32)), 2, axis=1)
    return W8A8Linear(codes_of(q, out), per_output(d * sc.astype(np.float32), out), per_output(mins, out))


FORMAT = Format("Q5_K", 256, 176, linear, "w8a8 with mins")
