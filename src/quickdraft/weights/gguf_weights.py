"""A GGUF Llama's or Qwen2's own quantized blocks, decoded for native-runtime linears without a round
trip (the formats and their math; `runtime/formats/gguf_linears.py` packs them into the kernel forms below).

    Q4_0  d (fp16) + 32 codes: w = (q - 8) d        -> int4 groups of 32: scale d, zero 0 (exact), or
                                                       w4a8 blocks: d, min -8 d
    Q4_1  d, m (fp16) + 32 codes: w = q d + m       -> int4 groups of 32: scale d, zero m + 8 d, or
                                                       w4a8 blocks: d, m (the block as it is)
    Q8_0  d (fp16) + 32 int8: w = q d               -> int8 per channel (re-rounded: the block scales
                                                        do not fit one scale per row), w8a8 blocks of
                                                        32 (the same grid), or left to the loaded
                                                        model's own float weight ("bf16")
    Q4_K  256-weight super-blocks: d, dmin (fp16),  -> q4k: the codes, sc_j, m_j, d and dmin as stored
          6-bit sc_j, m_j per 32: w = d sc_j q -          (exact), or int4 groups of 32: d sc_j and
          dmin m_j                                        -dmin m_j
    Q5_0  d (fp16) + 32 5-bit codes: w = (q - 16) d -> int8 codes q - 16 with the block's scale d: w8a8
                                                       blocks of 32 exactly, or int8 per channel
    Q6_K  256-weight super-blocks, an int8 scale    -> w6a8: the codes, sc_j and d as stored (exact), or
          per 16: w = d sc_j (q - 32)                     int8 per channel re-rounded from the exact values
    F32 / F16 / BF16                                -> left to the loaded model's own float weight

In float32 the int4 forms reproduce the GGUF's dequantized values exactly (tested on the `gguf`
package's own quantizer and on every linear of the default target; (q - 8) d + (m + 8 d) could round
once where q d + m does not, and did not there); with bf16 activations the kernel holds d and
m + 8 d in bf16 (8 bits of mantissa against fp16's 11), which is where a bf16 run differs from the
GGUF's own arithmetic. llama.cpp stores Llama's q and k rows permuted for its RoPE: the same row order
transformers undoes is undone here (rows are independent, so exactly); Qwen2's are not permuted.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.weights.gguf_convert import IN_BLOCK, PERMUTED, open_gguf, unpermute_rows
from quickdraft.weights.quant import Int4Linear

_LAYER = re.compile(r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")


def _fp16(raw: np.ndarray) -> torch.Tensor:
    """(..., 2) uint8 -> (...) float32 from little-endian fp16."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32))


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
    d = _fp16(blocks[..., 0:2])
    qs = torch.from_numpy(np.ascontiguousarray(blocks[..., head:]))  # (out, nb, 16)
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(out, -1)  # element j, then j + 16
    m = -8 * d if kind == "Q4_0" else _fp16(blocks[..., 2:4])
    return codes, d, m


def int4_form(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Int4Linear:
    """4-bit blocks of 32 (w = q d + m) as aten's int4 groups: w = (q - 8) d + (m + 8 d)."""
    return Int4Linear(codes, d, m + 8 * d, group=32)


def q8_0_blocks(raw: np.ndarray) -> torch.Tensor:
    """Q8_0 rows -> (out, in) float32, the GGUF's dequantized values (exact in float32)."""
    return q8_values(*q8_codes(raw, "Q8_0"))


def q8_values(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(out, in) float32 of int8 codes and their scales per block of 32: w = q d."""
    out, k = q.shape
    if k == 32 * d.shape[1]:  # whole blocks: each block's codes times its scale, in place of a repeated scale
        return (q.view(out, -1, 32).float() * d[..., None]).view(out, k)
    return q.float() * d.repeat_interleave(32, dim=1)[:, :k]


def q4_k_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K rows as 4-bit blocks of 32 (`q4_k_as_blocks` of `q4_k_parts`)."""
    return q4_k_as_blocks(*q4_k_parts(raw))


def q4_k_as_blocks(codes, sc, mn, d, dmin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`q4_k_parts` as 4-bit blocks of 32: w = q d' + m' with d' = d sc_j and m' = -dmin m_j.

    Returns:
        (codes (out, in) uint8 0..15, d' and m' (out, in / 32) float32: exact products of fp16 and 6-bit values).
    """
    return codes, d.repeat_interleave(8, dim=1) * sc.float(), -dmin.repeat_interleave(8, dim=1) * mn.float()


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


def q8_codes(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 / Q5_0 rows as int8 codes and one scale per block of 32: w = q d exactly.

    Args:
        raw: (out, blocks * bytes) uint8 (Q8_0: d, 32 int8; Q5_0: d, 4 bytes of fifth bits, 16 of nibbles).

    Returns:
        (q (out, in) int8 in [-127, 127] (Q5_0: [-16, 15]), d (out, in / 32) float32).
    """
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, 34 if kind == "Q8_0" else 22)
    d = _fp16(blocks[..., 0:2])
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
    return torch.from_numpy(codes), torch.from_numpy(sc.copy()), _fp16(blocks[..., 208:210])


def q6_k_weights(codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(out, in) float32 of `q6_k_blocks`'s parts: w = (d sc) (q - 32), the GGUF's dequantized values."""
    scale = d.repeat_interleave(16, dim=1) * sc.float()
    return scale.repeat_interleave(16, dim=1) * (codes.float() - 32)


def linear_tensors(path: Path, config):
    """(Hugging Face name, its role in the block ("attn_q", ..., None for the LM head), tensor) of every
    linear a GGUF holds: the layers' seven, and the LM head (`output.weight`, or the embedding when the
    model ties them)."""
    for t in open_gguf(path).tensors:
        match = _LAYER.match(t.name)
        if match is not None:
            yield f"model.layers.{match.group(1)}.{IN_BLOCK[match.group(2)]}.weight", match.group(2), t
        elif t.name == "output.weight" or (t.name == "token_embd.weight" and config.tie_word_embeddings):
            yield "lm_head.weight", None, t


def permuted_heads(config) -> dict[str, int]:
    """{role: heads} of the linears whose rows llama.cpp permuted (q and k of a Llama; none for Qwen2)."""
    if config.model_type not in PERMUTED:
        return {}
    return {"attn_q": int(config.num_attention_heads), "attn_k": int(config.num_key_value_heads)}


def gguf_float_reader(path: Path, config, decoders: dict | None = None):
    """name -> (out, in) float32 weight of a linear, dequantized from the GGUF's own blocks (exact), for
    quantizers that start from float weights (`w4a8-all`) on a model whose folder holds only bf16.

    Args:
        decoders: {GGUF type name: raw rows (out, bytes) uint8 tensor -> (out, in) float32}, exact decoders
            a caller has (the runtime's C++ ones for Q4_K and Q6_K); Q8_0 and Q5_0 decode here, the rest
            through the `gguf` package's dequantizer.
    """
    from gguf.quants import dequantize

    tensors = {name: (t, role) for name, role, t in linear_tensors(path, config)}
    heads = permuted_heads(config)
    decoders = decoders or {}

    def read(name: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The weight, or only its output `rows` (K,) (decoded alone: a row's blocks are its own)."""
        t, role = tensors[name]
        kind = t.tensor_type.name
        data = np.asarray(t.data).reshape(int(t.shape[1]), -1)  # (out, bytes or values) a row
        if rows is not None:
            if role in heads:  # the stored rows are permuted: read them all, then pick
                return read(name)[rows]
            data = data[rows.numpy()]
        if kind in ("Q8_0", "Q5_0"):
            w = q8_values(*q8_codes(data, kind))
        elif kind in decoders:
            w = decoders[kind](torch.from_numpy(np.array(data)))
        else:
            w = torch.from_numpy(np.array(dequantize(data, t.tensor_type), dtype=np.float32))
        w = w.reshape(data.shape[0], int(t.shape[0]))
        if role in heads:
            w = w[unpermute_rows(w.shape[0], heads[role])]
        return w

    return read


def tensor_blocks(raw: np.ndarray, kind: str, file: str, tensor: str) -> tuple:
    """(form, *tensors) of a quantized GGUF tensor: ("q4", codes, d, m), ("q4k", `q4_k_parts`), ("q8", q, d)
    or ("q6", `q6_k_blocks`)."""
    if kind in ("Q4_0", "Q4_1"):
        return ("q4", *q4_blocks(raw, kind))
    if kind == "Q4_K":
        return ("q4k", *q4_k_parts(raw))
    if kind in ("Q8_0", "Q5_0"):
        return ("q8", *q8_codes(raw, kind))
    if kind == "Q6_K":
        return ("q6", *q6_k_blocks(raw))
    raise QuickdraftError(
        f"{file}: tensor {tensor} has GGUF type {kind}, which has no kernel form here "
        f"(supported: {', '.join(GGUF_DIRECT)}); use --quantize int4 or int8 instead"
    )


FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # block types of 4-bit codes with a scale (and min) per 32 weights or finer
# what `--quantize gguf` packs (aten's int4/int8 forms); as stored, `runtime/formats` runs more
GGUF_DIRECT = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K", "F32", "F16", "BF16")


def gguf_types(path: Path, config) -> dict[str, str]:
    """{Hugging Face parameter name of a linear: its GGUF block type} (the tied LM head included)."""
    types = {}
    for name, role, t in linear_tensors(path, config):
        if role is not None:
            types[name] = t.tensor_type.name
        else:
            types.setdefault(name, t.tensor_type.name)
    return types
