"""The quantization modes (`QuantSpec`, parsed once at the edge) and the weight-only int8 and int4
linears for the native runtime (PyTorch's own CPU kernels). The linears on quickdraft's own fused
kernels (w8a8, w4a8) and the per-weight dispatch live in runtime/ (`runtime/kernels/w8a8.py`,
`runtime/kernels/w4a8.py`, `runtime/formats/quantized.py`), beside the kernels they call.

    none      bf16/float32 weights (runtime/kernels/linear.py)
    int8      one int8 per weight, one scale per output channel (`aten._weight_int8pack_mm`)
    w8a8      int8 weights in blocks of 32 inputs (a scale each), times activations quantized the same
              way per row on the fly (llama.cpp's Q8_0 x Q8_0; VNNI's vpdpbusd in quickdraft's fused
              kernels, runtime/kernels/fused.cpp): half bf16's weight bytes and twice its multiply-adds an
              instruction
    w4a8      4-bit weights in blocks of 32 (a scale and a min each: a GGUF's Q4_1 blocks as they are)
              times activations quantized per row as w8a8's (llama.cpp's Q4_1 x Q8_1; `runtime/kernels/w4a8.py`):
              5 bits a weight streamed, the fastest one-row step; the LM head stays w8a8
    w4a8-all  every linear, the LM head too, in min-max w4a8 blocks from the float weights, whatever finer
              blocks a GGUF holds: the cheapest step, lossy, made for a draft model (`model:NAME;quant=w4a8-all`)
    int4[:G]  4-bit groups of G = 32 (default) or 64 along the input: value = (q - 8) * scale + zero
              (`aten._weight_int4pack_mm_for_cpu`, the packing of `_convert_weight_to_int4pack_for_cpu`)
    gguf      a GGUF model's own blocks, packed without a round trip (runtime/formats/gguf_linears.py)

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


class Int8Linear:
    """y = x (q * s)^T with q (out, in) int8 and s (out,) per output channel."""

    __slots__ = ("q", "scales", "_cast")

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        self.q, self.scales = q.contiguous(), scales.float().contiguous()
        self._cast: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out) in x's dtype."""
        s = self._cast.get(x.dtype)
        if s is None:
            s = self._cast.setdefault(x.dtype, self.scales.to(x.dtype))
        return torch.ops.aten._weight_int8pack_mm(x, self.q, s)

    def rows(self, ids: torch.Tensor) -> Int8Linear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        return Int8Linear(self.q[ids], self.scales[ids])

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scales[:, None]

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scales.numel()


class Int4Linear:
    """y = x W^T with W[o, g*G + j] = (q[o, g*G + j] - 8) * scale[o, g] + zero[o, g], q in 0..15.

    Args:
        q: (out, in) integer codes 0..15.
        scale, zero: (out, in / group) float32.
        group: 32 or 64.
    """

    __slots__ = ("packed", "scale", "zero", "group", "codes", "_cast")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> None:
        out, k = q.shape
        check_group(group, k)
        self.codes = q.to(torch.uint8)  # kept for rows(), joins and dequantized(): a byte per weight, off the hot path
        pad = -out % 16  # the packing takes rows in sixteens: zero rows, cut from the output
        codes = torch.cat([q.to(torch.int32), q.new_zeros(pad, k, dtype=torch.int32)]) if pad else q.to(torch.int32)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
        self.scale, self.zero, self.group = scale.float(), zero.float(), group
        self._cast: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out) in x's dtype."""
        sz = self._cast.get(x.dtype)
        if sz is None:  # (in / group, out padded to 16, 2) in the activation dtype, as the kernel reads it
            sz = torch.stack([self.scale.t(), self.zero.t()], dim=-1)
            pad = self.packed.shape[0] - sz.shape[1]
            sz = torch.cat([sz, sz.new_zeros(sz.shape[0], pad, 2)], dim=1) if pad else sz
            sz = self._cast.setdefault(x.dtype, sz.to(x.dtype).contiguous())
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, sz)
        return y if y.shape[1] == self.codes.shape[0] else y[:, : self.codes.shape[0]]

    def rows(self, ids: torch.Tensor) -> Int4Linear:
        return Int4Linear(self.codes[ids], self.scale[ids], self.zero[ids], self.group)

    def dequantized(self) -> torch.Tensor:
        out, k = self.codes.shape
        q = self.codes.float().view(out, k // self.group, self.group) - 8
        return (q * self.scale[..., None] + self.zero[..., None]).view(out, k)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 8 * self.scale.numel()


def int8_linear(weight: torch.Tensor) -> Int8Linear:
    """Symmetric per-output-channel int8 of a float32 (out, in) weight (absmax / 127)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Linear(q, scales)


def int4_linear(weight: torch.Tensor, group: int = 32) -> Int4Linear:
    """Min-max int4 groups of `group` along the input of a float32 (out, in) weight: each group's
    16 levels span [min, max] (weights already on a 4-bit grid, e.g. a dequantized Q4_1 block, land
    back on it up to float32 rounding)."""
    w = weight.detach().float()
    out, k = w.shape
    check_group(group, k)
    blocks = w.view(out, k // group, group)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((blocks - lo[..., None]) / scale[..., None]).clamp(0, 15).view(out, k)
    return Int4Linear(q, scale, lo + 8 * scale, group)
