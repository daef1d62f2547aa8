"""The quantization modes (`QuantSpec`, parsed once at the edge) and the weight-only int8 and int4
linears for the native runtime (PyTorch's own CPU kernels). The linears on quickdraft's own fused
kernels (w8a8, w4a8) and the per-weight dispatch live in runtime/ (`runtime/quant/w8a8.py`,
`runtime/quant/w4a8.py`, `runtime/quant/quantized.py`), beside the kernels they call.

    none      bf16/float32 weights (runtime/kernels/linear.py)
    int8      one int8 per weight, one scale per output channel (`aten._weight_int8pack_mm`)
    w8a8      int8 weights in blocks of 32 inputs (a scale each), times activations quantized the same
              way per row on the fly (llama.cpp's Q8_0 x Q8_0; VNNI's vpdpbusd in quickdraft's fused
              kernels, runtime/kernels/fused.cpp): half bf16's weight bytes and twice its multiply-adds an
              instruction
    w4a8      4-bit weights in blocks of 32 (a scale and a min each: a GGUF's Q4_1 blocks as they are)
              times activations quantized per row as w8a8's (llama.cpp's Q4_1 x Q8_1; `runtime/quant/w4a8.py`):
              5 bits a weight streamed, the fastest one-row step; the LM head stays w8a8
    w4a8-all  every linear, the LM head too, in min-max w4a8 blocks from the float weights, whatever finer
              blocks a GGUF holds: the cheapest step, lossy, made for a draft model (`model:NAME;quant=w4a8-all`)
    int4[:G]  4-bit groups of G = 32 (default) or 64 along the input: value = (q - 8) * scale + zero
              (`aten._weight_int4pack_mm_for_cpu`, the packing of `_convert_weight_to_int4pack_for_cpu`)
    gguf      a GGUF model's own blocks, packed without a round trip (runtime/quant/gguf_linears.py)

Weights are quantized from float32 (the dequantized GGUF, or the checkpoint's own float32), never from
bf16-rounded copies: issue #25's probe lost greedy agreement exactly there (0.87 against 0.98).
Activations stay in the model's dtype (bf16 or float32: the kernels take no float64); the scales are
held in that dtype, so in bf16 they round to 8 bits of mantissa, which is the only loss beyond the
grid itself. `dequantized()` gives the float32 weight a linear computes with (tests and reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.errors import QuickdraftError

MODES = ("none", "int8", "w8a8", "w4a8", "w4a8-all", "int4", "gguf")
INT4_GROUPS = (32, 64)
W8A8_BLOCK = 32  # inputs per scale block of w8a8 weights and activations (the kernel's)
KERNEL_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


@dataclass(frozen=True)
class QuantSpec:
    """A parsed `--quantize` value: mode and (int4) group size."""

    mode: str = "none"
    group: int = 32

    def __str__(self) -> str:
        return f"int4:{self.group}" if self.mode == "int4" and self.group != 32 else self.mode

    @property
    def active(self) -> bool:
        return self.mode != "none"


def parse_quantize(text: str | None) -> QuantSpec:
    """`none | int8 | w8a8 | w4a8 | w4a8-all | int4[:32|:64] | gguf` -> QuantSpec (a clear error naming
    what is wrong)."""
    mode, colon, group = (text or "none").partition(":")
    if mode not in MODES:
        raise QuickdraftError(
            f"unknown quantization {text!r}; choose one of none, int8, w8a8, w4a8, w4a8-all, int4[:32|:64], gguf"
        )
    if not colon:
        return QuantSpec(mode)
    if mode != "int4":
        raise QuickdraftError(f"quantization {text!r}: only int4 takes a group size (int4:32 or int4:64)")
    if not group.isdigit() or int(group) not in INT4_GROUPS:
        raise QuickdraftError(f"quantization {text!r}: int4 group size must be 32 or 64 (the CPU kernel's)")
    return QuantSpec(mode, int(group))


def check_group(group: int, k: int) -> None:
    """Refuse int4 groups the kernel lacks or that do not divide an input of `k`."""
    if group not in INT4_GROUPS or k % group:
        raise QuickdraftError(f"int4 groups of {group} do not divide an input of {k} (groups: 32 or 64)")


def check_dtype(dtype: torch.dtype, what: str = "a quantized model") -> None:
    if dtype not in KERNEL_DTYPES:
        raise QuickdraftError(f"{what} runs in bfloat16 or float32 (the int8/int4 kernels take no {dtype})")
