"""GGUF Q3_K as stored: super-blocks of 256 weights, 6-bit signed scales sc_j per 16 (packed 4 + 2 bits),
3-bit signed codes (two bits plus an inverted high-bit plane) in -4..3, an fp16 d: w = d sc_j q. Runs as
Q6_K's kernel (w6a8: d sc_j (c - 32)) with the codes c = q + 32, exactly, times int8 activations."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, bits, crumbs, fp16
from quickdraft.runtime.quant.w6a8 import W6A8Linear


def scales(packed: np.ndarray) -> np.ndarray:
    """(n, 12) uint8 -> (n, 16) int8 scales in -32..31 (low nibbles of bytes 0-7, then 2-bit highs of 8-11)."""
    low = (packed[:, :8, None] >> np.array([0, 4], dtype=np.uint8)).transpose(0, 2, 1).reshape(-1, 16)
    high = (packed[:, 8:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)).transpose(0, 2, 1).reshape(-1, 16)
    return ((low & np.uint8(0x0F)) | ((high & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)


def linear(rows: torch.Tensor) -> W6A8Linear:
    """rows (out, super-blocks * 110) uint8 -> W6A8Linear(q + 32, sc, d) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    hmask, qs, d = b[:, :32], b[:, 32:96], fp16(b[:, 108:110])
    low = crumbs(qs, 32).reshape(-1, 16, 16).astype(np.int8)
    q = low - ((bits(hmask).reshape(-1, 16, 16) ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    codes = torch.from_numpy((q + 32).astype(np.uint8).reshape(out, -1))
    sc = torch.from_numpy(np.ascontiguousarray(scales(b[:, 96:108])).reshape(out, -1))
    return W6A8Linear(codes, sc, torch.from_numpy(d.reshape(out, -1)))


FORMAT = Format("Q3_K", 256, 110, linear, "w6a8")
