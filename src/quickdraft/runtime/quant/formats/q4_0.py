"""GGUF's 32-weight block types of the first generation, as stored: Q4_0 (w = (q - 8) d) and Q4_1 (w = q d +
m) as 4-bit blocks (`quant/w4a8.py`), Q8_0 (w = q d) and Q5_0 (w = (q - 16) d) as int8 blocks
(`quant/w8a8.py`), each times int8 activations; their block readers, which `--quantize gguf`'s aten forms
read too (`parts`)."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.quant.formats.base import Format, half
from quickdraft.runtime.quant.torch_linears import Int4Linear
from quickdraft.runtime.quant.w4a8 import W4A8Linear
from quickdraft.runtime.quant.w8a8 import W8A8Linear


def q4_blocks(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0 / Q4_1 rows as 4-bit blocks of 32: w = q d + m.

    Args:
        raw: (out, blocks * bytes_per_block) uint8, the tensor's bytes as the GGUF stores them.
        kind: "Q4_0" or "Q4_1".

    Returns:
        (codes (out, in) uint8 0..15, d (out, blocks) float32, m (out, blocks) float32: -8 d for Q4_0).
        Int4Linear's zero is m + 8 d (`int4_form`).
    """
    head = 2 if kind == "Q4_0" else 4
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, head + 16)
    d = half(blocks[..., 0:2])
    qs = torch.from_numpy(np.ascontiguousarray(blocks[..., head:]))  # (out, nb, 16)
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(out, -1)  # element j, then j + 16
    m = -8 * d if kind == "Q4_0" else half(blocks[..., 2:4])
    return codes, d, m


def int4_form(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Int4Linear:
    """4-bit blocks of 32 (w = q d + m) as aten's int4 groups: w = (q - 8) d + (m + 8 d)."""
    return Int4Linear(codes, d, m + 8 * d, group=32)


def q8_codes(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 / Q5_0 rows as int8 codes and one scale per block of 32: w = q d exactly.

    Args:
        raw: (out, blocks * bytes) uint8 (Q8_0: d, 32 int8; Q5_0: d, 4 bytes of fifth bits, 16 of nibbles).

    Returns:
        (q (out, in) int8 in [-127, 127] (Q5_0: [-16, 15]), d (out, in / 32) float32).
    """
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, 34 if kind == "Q8_0" else 22)
    d = half(blocks[..., 0:2])
    if kind == "Q8_0":
        return torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(out, -1).copy()), d
    # Q5_0 (llama.cpp's dequantize_row_q5_0): weight j < 16 is the low nibble of byte j, j >= 16 the
    # high nibble of byte j - 16, each with bit j of the 32-bit word qh as its fifth bit, less 16
    b = torch.from_numpy(np.array(blocks))  # a copy: the file's memory map is read-only
    bits = (b[..., 2:6, None] >> torch.arange(8, dtype=torch.uint8)) & 1  # qh's bytes little-endian: bit j
    fifth = bits.reshape(*b.shape[:-1], 32) << 4
    qs = b[..., 6:22]
    q = (torch.cat([qs & 0x0F, qs >> 4], dim=-1) | fifth).to(torch.int8) - 16
    return q.reshape(out, -1), d


def q8_values(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(out, in) float32 of int8 codes and their scales per block of 32: w = q d."""
    out, k = q.shape
    if k == 32 * d.shape[1]:  # whole blocks: each block's codes times its scale, in place of a repeated scale
        return (q.view(out, -1, 32).float() * d[..., None]).view(out, k)
    return q.float() * d.repeat_interleave(32, dim=1)[:, :k]


def q8_0_blocks(raw: np.ndarray) -> torch.Tensor:
    """Q8_0 rows -> (out, in) float32, the GGUF's dequantized values (exact in float32)."""
    return q8_values(*q8_codes(raw, "Q8_0"))


def _raw(rows: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(rows.numpy())


def _q4(kind: str) -> Format:
    linear = lambda rows: W4A8Linear(*q4_blocks(_raw(rows), kind))  # noqa: E731
    return Format(kind, 32, 18 if kind == "Q4_0" else 20, linear, "w4a8", lambda raw: ("q4", *q4_blocks(raw, kind)))


def _q8(kind: str) -> Format:
    linear = lambda rows: W8A8Linear(*q8_codes(_raw(rows), kind))  # noqa: E731
    return Format(kind, 32, 34 if kind == "Q8_0" else 22, linear, "w8a8", lambda raw: ("q8", *q8_codes(raw, kind)))


FORMAT, Q4_1, Q8_0, Q5_0 = _q4("Q4_0"), _q4("Q4_1"), _q8("Q8_0"), _q8("Q5_0")
