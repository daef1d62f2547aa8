"""A GGUF's linears in kernel form, keyed by Hugging Face parameter name. As stored (w4a8 and w8a8 forms,
the default): each tensor's rows through its type's record in `runtime/quant/formats` (twelve block types; a
type without one is refused in one line). `--quantize gguf`'s forms: the blocks as decoded by
their records' block readers (`Format.parts`: Q4_0/Q4_1/Q4_K codes, Q8_0/Q5_0 8-bit codes, Q6_K values)
packed for aten's int4/int8. Q4_K and Q6_K go from the file's rows to the kernels' layout in one C++ pass
(`pack_q4k_gguf`, `pack_q6_gguf`), never decoded in numpy first.

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

import warnings
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.quant import formats
from quickdraft.runtime.quant.formats.q4_0 import int4_form, q8_values
from quickdraft.runtime.quant.formats.q4_k import q4_k_as_blocks
from quickdraft.runtime.quant.gguf_tensors import gguf_direct, linear_tensors, permuted_heads
from quickdraft.runtime.quant.q4k import Q4KLinear
from quickdraft.runtime.quant.rows import RowSlice
from quickdraft.runtime.quant.torch_linears import int8_linear
from quickdraft.runtime.quant.w4a8 import W4A8Linear
from quickdraft.runtime.quant.w6a8 import W6A8Linear, q6_k_weights
from quickdraft.runtime.quant.w8a8 import W8A8Linear, w8a8_linear
from quickdraft.weights.gguf_convert import open_gguf, unpermute_rows

Q8_FORMS = ("bf16", "int8", "w8a8")
Q4_FORMS = ("int4", "w4a8")


def gguf_linears(
    path: Path, config, q8: str = "int8", q4: str = "int4", fuse: tuple[tuple[str, ...], ...] = ()
) -> tuple[dict[str, object], dict[str, int]]:
    """Every linear of a Llama GGUF in its nearest kernel form, keyed by Hugging Face parameter name.

    Args:
        path: the .gguf file.
        config: the model's Hugging Face config (heads, kv heads, tie_word_embeddings).
        q8: what Q8_0 tensors (the default target's tied LM head) become: "int8" (per channel,
            re-rounded from their exact float32 values), "w8a8" (blocks of 32: the same grid; Q6_K
            then runs as stored, w6a8) or "bf16" (left to the model's own weight).
        q4: what Q4_0/Q4_1/Q4_K tensors become: "int4" (aten's weight-only kernel) or "w4a8" (Q4_K as
            stored: q4k). Q5_0 follows `q8`, and Q6_K becomes int8 under "int8" and "bf16".
        fuse: groups of a layer's linears ("self_attn.q_proj", ...) built as stored as one linear over
            their rows where they share a type, each a RowSlice of it (what `rows.fused_slices` makes).

    Returns:
        ({name: a kernel-form linear}, {GGUF type: count of the linears' tensors}). Linears left to the
        loaded model (float types; Q8_0 as "bf16") are counted but not returned: the model was
        converted from this same file, so its weights hold the same values.
    """
    if q8 not in Q8_FORMS or q4 not in Q4_FORMS:
        raise QuickdraftError(f"GGUF forms {q8!r}, {q4!r}: choose from {', '.join(Q8_FORMS)} and {', '.join(Q4_FORMS)}")
    heads = permuted_heads(config)
    linears: dict[str, object] = {}
    types: dict[str, int] = {}
    stored = (q8, q4) == ("w8a8", "w4a8")
    tensors = list(linear_tensors(path, config))
    missing = formats.unsupported([t.tensor_type.name for _, _, t in tensors]) if stored else []
    if missing:
        raise QuickdraftError(
            f"{path.name}: GGUF type {', '.join(missing)} has no kernel here to run as stored "
            f"(runs: {formats.describe()}); use --quantize none (its bf16 conversion) or int8"
        )
    reader = open_gguf(path)  # each tensor's pages are dropped once packed: `reader.release`
    pending: dict[tuple[str, ...], dict[str, tuple]] = {}
    for name, role, t in tensors:
        kind = t.tensor_type.name
        types[kind] = types.get(kind, 0) + 1
        raw = np.asarray(t.data)
        if kind in formats.FLOATS or (kind == "Q8_0" and q8 == "bf16"):
            continue
        if stored or (kind == "Q4_K" and q4 == "w4a8"):  # as stored: the type's record
            with warnings.catch_warnings():  # the file's read-only memory map: the builders only read it
                warnings.simplefilter("ignore", UserWarning)
                rows = torch.from_numpy(np.ascontiguousarray(raw))
            if role in heads:
                rows = rows[unpermute_rows(raw.shape[0], heads[role])]
            group = _group_of(name, fuse)
            if group is None:
                linears[name] = formats.FORMATS[kind].linear(rows)
                reader.release(raw)
                continue
            pending.setdefault(group, {})[name] = (kind, rows, raw)
            if len(pending[group]) == len(group):
                parts = pending.pop(group)
                linears.update(_built_together(reader, [(n, *parts[n]) for n in group]))
            continue
        form = tensor_blocks(raw, kind, path.name, t.name)
        if role in heads:
            order = unpermute_rows(raw.shape[0], heads[role])
            form = (form[0], *(x[order] for x in form[1:]))
        linears[name] = _kernel_form(form, q8, q4)
        reader.release(raw)
    for group, parts in pending.items():  # a group the file holds only part of: each part alone
        linears.update(_built_together(reader, [(n, *parts[n]) for n in group if n in parts]))
    return linears, types


def _group_of(name: str, fuse: tuple[tuple[str, ...], ...]) -> tuple[str, ...] | None:
    """The full names of the fused group `name` belongs to ("model.layers.3.self_attn.q_proj.weight" ->
    that layer's q, k and v), or None."""
    for group in fuse:
        for part in group:
            if name.endswith(f".{part}.weight"):
                stem = name[: -len(f"{part}.weight")]
                return tuple(f"{stem}{p}.weight" for p in group)
    return None


def _built_together(reader, parts: list[tuple[str, str, torch.Tensor, np.ndarray]]) -> dict[str, object]:
    """{name: linear} of (name, GGUF type, stored rows, the file's bytes) parts: one linear over their
    concatenated rows, each part a RowSlice of it, where they share a type (the file's rows are per-row
    blocks); else each alone. Built whole from the rows, never as parts then copied together: a load
    holds one copy. The parts' pages in `reader` are dropped after."""
    if len(parts) < 2 or len({kind for _, kind, _, _ in parts}) > 1:
        built = {name: formats.FORMATS[kind].linear(rows) for name, kind, rows, _ in parts}
    else:
        whole = formats.FORMATS[parts[0][1]].linear(torch.cat([rows for _, _, rows, _ in parts]))
        bounds = [0]
        for _, _, rows, _ in parts:
            bounds.append(bounds[-1] + rows.shape[0])
        built = {name: RowSlice(whole, a, b) for (name, *_), a, b in zip(parts, bounds, bounds[1:], strict=False)}
    for *_, raw in parts:
        reader.release(raw)
    return built


def tensor_blocks(raw: np.ndarray, kind: str, file: str, tensor: str) -> tuple:
    """(form, *tensors) of a quantized GGUF tensor, read by its type's record (`Format.parts`)."""
    record = formats.FORMATS.get(kind)
    if record is None or record.parts is None:
        raise QuickdraftError(
            f"{file}: tensor {tensor} has GGUF type {kind}, which has no kernel form here "
            f"(supported: {', '.join(gguf_direct())}); use --quantize int4 or int8 instead"
        )
    return record.parts(raw)


def _kernel_form(form: tuple, q8: str, q4: str) -> object:
    """The kernel-form linear of `tensor_blocks`'s output: 4-bit blocks as int4 or w4a8 (Q4_K as stored: q4k),
    8-bit ones as int8 (per channel, re-rounded) or w8a8 (blocks of 32: exact for Q8_0 / Q5_0's codes), Q6_K as
    stored (w6a8) under w8a8, else from its exact float values like an 8-bit form."""
    kind, parts = form[0], form[1:]
    if kind == "q4k":
        return Q4KLinear(*parts) if q4 == "w4a8" else int4_form(*q4_k_as_blocks(*parts))
    if kind == "q4":
        return int4_form(*parts) if q4 == "int4" else W4A8Linear(*parts)
    if kind == "q6" and q8 == "w8a8":
        return W6A8Linear(*parts)
    if kind == "q8" and q8 == "w8a8":
        return W8A8Linear(*parts)
    w = q6_k_weights(*parts) if kind == "q6" else q8_values(*parts)
    return int8_linear(w) if q8 == "int8" else w8a8_linear(w)
