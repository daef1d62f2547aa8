"""GGUF's 32-weight block types of the first generation, as stored: Q4_0 (w = (q - 8) d) and Q4_1 (w = q d +
m) as 4-bit blocks (`runtime/kernels/w4a8.py`), Q8_0 (w = q d) and Q5_0 (w = (q - 16) d) as int8 blocks
(`runtime/kernels/w8a8.py`), each times int8 activations. The block readers: `weights/gguf_weights.py`."""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.formats.base import Format
from quickdraft.runtime.kernels.w4a8 import W4A8Linear
from quickdraft.runtime.kernels.w8a8 import W8A8Linear
from quickdraft.weights.gguf_weights import q4_blocks, q8_codes


def _raw(rows: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(rows.numpy())


FORMAT = Format("Q4_0", 32, 18, lambda rows: W4A8Linear(*q4_blocks(_raw(rows), "Q4_0")), "w4a8")
Q4_1 = Format("Q4_1", 32, 20, lambda rows: W4A8Linear(*q4_blocks(_raw(rows), "Q4_1")), "w4a8")
Q8_0 = Format("Q8_0", 32, 34, lambda rows: W8A8Linear(*q8_codes(_raw(rows), "Q8_0")), "w8a8")
Q5_0 = Format("Q5_0", 32, 22, lambda rows: W8A8Linear(*q8_codes(_raw(rows), "Q5_0")), "w8a8")
