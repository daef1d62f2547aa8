"""A GGUF's linears as tensors: which of its tensors are a model's linears (and under which Hugging Face
names), their block types, the rows llama.cpp permuted, and their exact float values for quantizers that
start from floats. What each block type becomes is its record's business (`formats/`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from quickdraft.runtime.quant.formats import FLOATS, FORMATS
from quickdraft.runtime.quant.formats.q4_0 import q8_codes, q8_values
from quickdraft.weights.gguf_convert import IN_BLOCK, PERMUTED, open_gguf, unpermute_rows

_LAYER = re.compile(r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")


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


FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # block types of 4-bit codes with a scale (and min) per 32 weights or finer


def gguf_direct() -> tuple[str, ...]:
    """The block types `--quantize gguf` packs for aten's int4/int8 (records with a block reader), and floats;
    as stored, more run (`formats.FORMATS`)."""
    return (*(name for name, f in FORMATS.items() if f.parts is not None), *FLOATS)


def gguf_types(path: Path, config) -> dict[str, str]:
    """{Hugging Face parameter name of a linear: its GGUF block type} (the tied LM head included)."""
    types = {}
    for name, role, t in linear_tensors(path, config):
        if role is not None:
            types[name] = t.tensor_type.name
        else:
            types.setdefault(name, t.tensor_type.name)
    return types
