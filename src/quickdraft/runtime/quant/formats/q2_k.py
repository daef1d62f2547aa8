"""GGUF Q2_K as stored: super-blocks of 256 weights, 4-bit sc_j and m_j per 16, 2-bit codes, fp16 d and
dmin: w = d sc_j q - dmin m_j. Runs as w8a8 with mins: the integer sc_j q (0..45) as the code, d as the
scale of each block of 32, -dmin m_j as the min of each 16 (d (sc_j q) is d sc_j q exactly in float32),
times int8 activations (llama.cpp's Q2_K x Q8_K)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, codes_of, crumbs, fp16, per_output
from quickdraft.runtime.quant.w8a8 import W8A8Linear


def linear(rows: torch.Tensor) -> W8A8Linear:
    """rows (out, super-blocks * 84) uint8 -> W8A8Linear(sc q, d, -dmin m) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], fp16(b[:, 80:82]), fp16(b[:, 82:84])
    q = crumbs(qs, 32).reshape(-1, 16, 16).astype(np.int16) * (scales & np.uint8(0x0F))[:, :, None]
    mins = -(dmin * (scales >> np.uint8(4)).astype(np.float32))
    return W8A8Linear(codes_of(q, out), per_output(np.repeat(d, 8, axis=1), out), per_output(mins, out))


FORMAT = Format("Q2_K", 256, 84, linear, "w8a8 with mins")
