"""A GGUF Llama's own quantized blocks as native-runtime linears, without a dequantize-requantize trip.

    Q4_0  d (fp16) + 32 codes: w = (q - 8) d        -> int4 groups of 32: scale d, zero 0 (exact), or
                                                       w4a8 blocks: d, min -8 d
    Q4_1  d, m (fp16) + 32 codes: w = q d + m       -> int4 groups of 32: scale d, zero m + 8 d, or
                                                       w4a8 blocks: d, m (the block as it is)
    Q8_0  d (fp16) + 32 int8: w = q d               -> int8 per channel (re-rounded: the block scales
                                                        do not fit one scale per row), w8a8 blocks of
                                                        32 (the same grid), or left to the loaded
                                                        model's own float weight ("bf16")
    F32 / F16 / BF16                                -> left to the loaded model's own float weight

In float32 the int4 forms reproduce the GGUF's dequantized values exactly (tested on the `gguf`
package's own quantizer and on every linear of the default target; (q - 8) d + (m + 8 d) could round
once where q d + m does not, and did not there); with bf16 activations the kernel holds d and
m + 8 d in bf16 (8 bits of mantissa against fp16's 11), which is where a bf16 run differs from the
GGUF's own arithmetic. llama.cpp stores Llama's q and k rows permuted for its RoPE: the same row order
transformers undoes is undone here (rows are independent, so exactly).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.weights.quant import Int4Linear, int8_linear, w8a8_linear
from quickdraft.weights.w4a8 import W4A8Linear

_LAYER = re.compile(r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
Q8_FORMS = ("bf16", "int8", "w8a8")
Q4_FORMS = ("int4", "w4a8")


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
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, 34)
    d = _fp16(blocks[..., 0:2])
    q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.float32))
    return (q * d[..., None]).reshape(out, -1)


def unpermute_rows(n_rows: int, heads: int) -> torch.Tensor:
    """(n_rows,) the row order that undoes llama.cpp's q/k permutation for `heads` heads."""
    dim = n_rows // heads // 2
    return torch.arange(n_rows).reshape(heads, dim, 2).transpose(1, 2).reshape(-1)


def gguf_linears(path: Path, config, q8: str = "int8", q4: str = "int4") -> tuple[dict[str, object], dict[str, int]]:
    """Every linear of a Llama GGUF in its nearest kernel form, keyed by Hugging Face parameter name.

    Args:
        path: the .gguf file.
        config: the model's Hugging Face config (heads, kv heads, tie_word_embeddings).
        q8: what Q8_0 tensors (the default target's tied LM head) become: "int8" (per channel,
            re-rounded from their exact float32 values), "w8a8" (blocks of 32: the same grid) or
            "bf16" (left to the model's own weight).
        q4: what Q4_0/Q4_1 tensors become: "int4" (aten's weight-only kernel) or "w4a8".

    Returns:
        ({name: a kernel-form linear}, {GGUF type: count of the linears' tensors}). Linears left to the
        loaded model (float types; Q8_0 as "bf16") are counted but not returned: the model was
        converted from this same file, so its weights hold the same values.
    """
    from gguf import GGUFReader

    if q8 not in Q8_FORMS or q4 not in Q4_FORMS:
        raise QuickdraftError(f"GGUF forms {q8!r}, {q4!r}: choose from {', '.join(Q8_FORMS)} and {', '.join(Q4_FORMS)}")
    reader = GGUFReader(path)
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    linears: dict[str, object] = {}
    types: dict[str, int] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        match = _LAYER.match(t.name)
        is_head = t.name == "output.weight" or (t.name == "token_embd.weight" and config.tie_word_embeddings)
        if match is None and not is_head:
            continue
        types[kind] = types.get(kind, 0) + 1
        raw = np.asarray(t.data)
        if kind in ("F32", "F16", "BF16") or (kind == "Q8_0" and q8 == "bf16"):
            continue
        if kind in ("Q4_0", "Q4_1"):
            form: object = q4_blocks(raw, kind)
        elif kind == "Q8_0":
            form = q8_0_blocks(raw)
        else:
            raise QuickdraftError(
                f"{path.name}: tensor {t.name} has GGUF type {kind}, which has no kernel form here "
                "(supported: Q4_0, Q4_1, Q8_0, F32, F16, BF16); use --quantize int4 or int8 instead"
            )
        if match is not None and match.group(2) in ("attn_q", "attn_k"):
            n = raw.shape[0]
            order = unpermute_rows(n, heads if match.group(2) == "attn_q" else kv_heads)
            form = tuple(x[order] for x in form) if isinstance(form, tuple) else form[order]
        if isinstance(form, tuple):
            form = int4_form(*form) if q4 == "int4" else W4A8Linear(*form)
        else:
            form = int8_linear(form) if q8 == "int8" else w8a8_linear(form)
        name = "lm_head.weight" if is_head else f"model.layers.{match.group(1)}.{_HF[match.group(2)]}.weight"
        linears[name] = form
    return linears, types


FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # block types of 4-bit codes with a scale (and min) per 32 weights or finer
GGUF_DIRECT = ("Q4_0", "Q4_1", "Q8_0", "F32", "F16", "BF16")  # what `gguf_linears` packs as the file holds it


def gguf_types(path: Path, config) -> dict[str, str]:
    """{Hugging Face parameter name of a linear: its GGUF block type} (the tied LM head included)."""
    from gguf import GGUFReader

    types = {}
    for t in GGUFReader(path).tensors:
        match = _LAYER.match(t.name)
        if match is not None:
            types[f"model.layers.{match.group(1)}.{_HF[match.group(2)]}.weight"] = t.tensor_type.name
        elif t.name == "output.weight" or (t.name == "token_embd.weight" and config.tie_word_embeddings):
            types.setdefault("lm_head.weight", t.tensor_type.name)
    return types
