"""GGUF IQ4_XS as stored: super-blocks of 256 weights, an fp16 d, 6-bit scales ls_j per 32 (4 low bits
packed as nibbles, 2 high bits in a 16-bit word), IQ4_NL's table indices: w = d (ls_j - 32) kv[i]. Runs as
w8a8: the table's values as the codes, d (ls_j - 32) as each block's scale (exact in float32), times int8
activations (llama.cpp's IQ4_XS x Q8_K)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, codes_of, fp16, nibbles, per_output
from quickdraft.runtime.quant.formats.iq4_nl import VALUES
from quickdraft.runtime.quant.w8a8 import W8A8Linear


def linear(rows: torch.Tensor) -> W8A8Linear:
    """rows (out, super-blocks * 136) uint8 -> W8A8Linear(kv[i], d (ls - 32)) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    d, high, low = fp16(b[:, :2]), np.ascontiguousarray(b[:, 2:4]).view(np.uint16), b[:, 4:8]
    ls_low = nibbles(low, 1).reshape(-1, 8)
    ls_high = (high >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)).astype(np.uint8) & np.uint8(3)
    ls = (ls_low | (ls_high << np.uint8(4))).astype(np.float32) - 32
    return W8A8Linear(codes_of(VALUES[nibbles(b[:, 8:], 16)], out), per_output(d * ls, out))


FORMAT = Format("IQ4_XS", 256, 136, linear, "w8a8")
