"""GGUF Q6_K as stored (`quant/w6a8.py`: 7 bits a weight), times int8 activations; its block readers
(`parts`: `--quantize gguf`'s forms, and tests; `q6_k_weights` is the kernel form's own arithmetic)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, half
from quickdraft.runtime.quant.w6a8 import W6A8Linear, q6_k_weights

__all__ = ["FORMAT", "q6_k_blocks", "q6_k_values", "q6_k_weights"]


def q6_k_values(raw: np.ndarray) -> torch.Tensor:
    """Q6_K rows -> (out, in) float32, the GGUF's dequantized values (exact in float32)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType.Q6_K), dtype=np.float32))


def q6_k_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K rows -> (codes (out, in) uint8 0..63, sc (out, in / 16) int8, d (out, in / 256) float32):
    w = d sc[k // 16] (q - 32). A super-block is 128 bytes of low nibbles, 64 of high bit pairs, 16
    scales and d; each 128 weights take 64 nibble bytes (l, l + 32: low then high nibble for weights l,
    l + 64 and l + 32, l + 96) and 32 bit-pair bytes (weight l + 32 i takes bits 2 i, 2 i + 1 of byte l)."""
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, 210)
    ql, qh = blocks[..., :128].reshape(out, -1, 2, 64), blocks[..., 128:192].reshape(out, -1, 2, 32)
    nib = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-2)
    high = np.stack([(qh >> (2 * i)) & 3 for i in range(4)], axis=-2)  # (out, super, half, 4, 32)
    codes = (nib | (high << 4)).astype(np.uint8).reshape(out, -1)
    sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).reshape(out, -1)
    return torch.from_numpy(codes), torch.from_numpy(sc.copy()), half(blocks[..., 208:210])


FORMAT = Format("Q6_K", 256, 210, W6A8Linear.from_gguf, "w6a8", lambda raw: ("q6", *q6_k_blocks(raw)))
