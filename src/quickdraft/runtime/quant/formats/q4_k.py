"""GGUF Q4_K as stored (`quant/q4k.py`: its kernel streams the file's 4.5 bits a weight, packed in one C++
pass), times int8 activations; its block reader (`parts`: `--quantize gguf`'s aten forms, and tests)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format
from quickdraft.runtime.quant.q4k import Q4KLinear


def q4_k_parts(raw: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Q4_K rows as stored: w = d sc_j q - dmin mn_j.

    Args:
        raw: (out, super-blocks * 144) uint8: per 256 weights d, dmin (fp16), 12 bytes of eight 6-bit
            scales and mins, 128 bytes of codes (each 64 weights: 32 low nibbles, then 32 high ones).

    Returns:
        (codes (out, in) uint8 0..15, sc and mn (out, in / 32) uint8 0..63, d and dmin (out, in / 256) float32).
    """
    from gguf.quants import Q4_K

    out = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, 144)
    d = blocks[:, 0:2].view(np.float16).astype(np.float32).reshape(out, -1)
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32).reshape(out, -1)
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = torch.from_numpy((qs & 0x0F).reshape(out, -1))
    six = [torch.from_numpy(np.ascontiguousarray(t, dtype=np.uint8).reshape(out, -1)) for t in (sc, mn)]
    return codes, *six, torch.from_numpy(d), torch.from_numpy(dmin)


def q4_k_as_blocks(codes, sc, mn, d, dmin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`q4_k_parts` as 4-bit blocks of 32: w = q d' + m' with d' = d sc_j and m' = -dmin m_j.

    Returns:
        (codes (out, in) uint8 0..15, d' and m' (out, in / 32) float32: exact products of fp16 and 6-bit values).
    """
    return codes, d.repeat_interleave(8, dim=1) * sc.float(), -dmin.repeat_interleave(8, dim=1) * mn.float()


def q4_k_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K rows as 4-bit blocks of 32 (`q4_k_as_blocks` of `q4_k_parts`)."""
    return q4_k_as_blocks(*q4_k_parts(raw))


FORMAT = Format("Q4_K", 256, 144, Q4KLinear.from_gguf, "q4k", lambda raw: ("q4k", *q4_k_parts(raw)))
