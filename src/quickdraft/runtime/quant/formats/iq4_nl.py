"""GGUF IQ4_NL as stored: blocks of 32 weights, an fp16 d and 4-bit indices into a fixed non-linear table of
int8 values (`gguf.quants.IQ4_NL.kvalues`): w = d kv[i]. Runs as w8a8: the table's values as the codes, d
as the scale, times int8 activations (llama.cpp's IQ4_NL x Q8_0)."""

from __future__ import annotations

import numpy as np
import torch
from gguf.quants import IQ4_NL

from quickdraft.runtime.quant.formats.base import Format, codes_of, fp16, nibbles, per_output
from quickdraft.runtime.quant.w8a8 import W8A8Linear

VALUES = np.array(IQ4_NL.kvalues, dtype=np.int8)  # the table, -127..113


def linear(rows: torch.Tensor) -> W8A8Linear:
    """rows (out, blocks * 18) uint8 -> W8A8Linear(kv[i], d) with the file's values."""
    out, b = rows.shape[0], FORMAT.blocks(rows)
    return W8A8Linear(codes_of(VALUES[nibbles(b[:, 2:], 16)], out), per_output(fp16(b[:, :2]), out))


FORMAT = Format("IQ4_NL", 32, 18, linear, "w8a8")
