"""What a weight format is to the runtime: one record per GGUF block type (`Format`), and the byte
helpers its block reader shares with the others.

A record says how many bytes hold how many weights, how the tensor's rows as stored (uint8, one row of
whole blocks per output) become a kernel-form linear whose weights are exactly the file's values, and
what it computes in. Records live one a file beside this one (`q5_1.py`, `q2_k.py`, ...); the registry
in `runtime/quant/formats/__init__.py` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from quickdraft.errors import QuickdraftError


@dataclass(frozen=True)
class Format:
    """One GGUF block type run as stored.

    Attributes:
        name: the GGUF type's name ("Q5_K").
        block_weights: weights a block holds (32, or 256 for a K-quant super-block).
        block_bytes: bytes a block takes in the file.
        linear: rows as stored, (out, in / block_weights * block_bytes) uint8, -> a kernel-form linear
            (`dequantized()` gives back the file's values exactly).
        kernel: the kernel it runs on, as the source line names it ("w8a8 with mins").
        parts: None, or the block reader `--quantize gguf`'s aten forms take: rows as stored (out, bytes)
            uint8 numpy -> (form, *tensors), form one of "q4" (codes, d, m: w = q d + m), "q4k" (Q4_K's
            codes, sc, mn, d, dmin), "q8" (int8 codes, d per 32) or "q6" (Q6_K's codes, sc, d).
    """

    name: str
    block_weights: int
    block_bytes: int
    linear: Callable[[torch.Tensor], object]
    kernel: str
    parts: Callable[[np.ndarray], tuple] | None = None

    def blocks(self, rows: torch.Tensor) -> np.ndarray:
        """(out * blocks, block_bytes) uint8 of rows as stored, checked against the block size."""
        if rows.dim() != 2 or rows.shape[1] % self.block_bytes:
            raise QuickdraftError(
                f"{self.name} rows must be (out, blocks x {self.block_bytes}) bytes, not {tuple(rows.shape)}"
            )
        return np.ascontiguousarray(rows.numpy()).reshape(-1, self.block_bytes)

    def columns(self, rows: torch.Tensor) -> int:
        """The weight's input features: the rows' blocks times the weights a block holds."""
        return rows.shape[1] // self.block_bytes * self.block_weights


def fp16(raw: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian fp16 -> (..., 1) float32."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def half(raw: np.ndarray) -> torch.Tensor:
    """(..., 2) uint8 little-endian fp16 -> (...) float32 tensor (`fp16` without its last axis)."""
    return torch.from_numpy(fp16(raw)[..., 0])


def nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """(n, groups * width) uint8 -> (n, groups, 2, width) codes: each byte's low nibble, then its high one
    (the 4-bit layout every GGUF type shares: a group's first `width` weights low, the next high)."""
    q = qs.reshape(qs.shape[0], -1, 1, width) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return q & np.uint8(0x0F)


def crumbs(qs: np.ndarray, width: int) -> np.ndarray:
    """(n, groups * width) uint8 -> (n, groups, 4, width) 2-bit codes: bits 0-1, 2-3, 4-5, 6-7 of each byte."""
    q = qs.reshape(qs.shape[0], -1, 1, width) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return q & np.uint8(3)


def bits(mask: np.ndarray) -> np.ndarray:
    """(n, w) uint8 -> (n, 8, w): bit 0 of every byte, then bit 1, ..., bit 7."""
    b = mask.reshape(mask.shape[0], 1, -1) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return b & np.uint8(1)


def per_output(values: np.ndarray, out: int) -> torch.Tensor:
    """Per-block values of every output's blocks in file order -> (out, -1) float32."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(out, -1))


def codes_of(values: np.ndarray, out: int) -> torch.Tensor:
    """Integer codes of every output's blocks in file order -> (out, in) int8."""
    return torch.from_numpy(np.ascontiguousarray(values).astype(np.int8).reshape(out, -1))
