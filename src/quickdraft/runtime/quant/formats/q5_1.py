"""GGUF Q5_1 as stored: blocks of 32 weights, fp16 d and m, 5-bit codes (4 low bits packed as nibbles, the
fifth in a 32-bit mask): w = d q + m. Runs as w8a8 with mins: codes 0..31, scale d, the min m (per 16: the
block's, twice), times int8 activations (llama.cpp's Q5_1 x Q8_1)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, bits, codes_of, fp16, nibbles, per_output
from quickdraft.runtime.quant.w8a8 import W8A8Linear


def linear(rows: torch.Tensor) -> W8A8Linear:
    """rows (out, blocks * 24) uint8 -> W8A8Linear(q, d, m) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    d, m, qh, qs = fp16(b[:, :2]), fp16(b[:, 2:4]), b[:, 4:8], b[:, 8:]
    q = nibbles(qs, 16).reshape(-1, 32) | (bits(qh).transpose(0, 2, 1).reshape(-1, 32) << np.uint8(4))
    return W8A8Linear(codes_of(q, out), per_output(d, out), per_output(np.repeat(m, 2, axis=1), out))


FORMAT = Format("Q5_1", 32, 24, linear, "w8a8 with mins")
