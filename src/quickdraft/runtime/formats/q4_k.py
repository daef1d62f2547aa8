"""GGUF Q4_K as stored (`runtime/kernels/q4k.py`: its kernel streams the file's 4.5 bits a weight, packed in one C++
pass) and Q6_K as stored (`runtime/kernels/w6a8.py`: 7 bits a weight). Both times int8 activations."""

from __future__ import annotations

from quickdraft.runtime.formats.base import Format
from quickdraft.runtime.kernels.q4k import Q4KLinear
from quickdraft.runtime.kernels.w6a8 import W6A8Linear

FORMAT = Format("Q4_K", 256, 144, Q4KLinear.from_gguf, "q4k")
Q6_K = Format("Q6_K", 256, 210, W6A8Linear.from_gguf, "w6a8")
