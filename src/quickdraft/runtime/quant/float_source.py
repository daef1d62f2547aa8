"""Where quantizers that start from floats read a model's float32 weights (`float32_source`): the model
itself in float32/float64, a float32 checkpoint in its folder, else the GGUF it was converted from (its
blocks dequantized exactly), else its own (bf16) weights, with a line saying which."""

from __future__ import annotations

from pathlib import Path

import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.quant.gguf_tensors import gguf_float_reader
from quickdraft.runtime.quant.q4k import Q4KLinear
from quickdraft.runtime.quant.w6a8 import W6A8Linear
from quickdraft.weights.loading import LoadedModel


def checkpoint_reader(folder: Path | None):
    """(name -> float32 tensor or None, the stored dtype of the LM head ("F32", "BF16", ...)) for a
    folder's safetensors, or None without files. Dtypes come from the headers: nothing is read twice."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if not files:
        return None
    where: dict[str, tuple[Path, str]] = {}
    for f in files:
        with safe_open(f, framework="pt") as reader:
            where.update({name: (f, reader.get_slice(name).get_dtype()) for name in reader.keys()})  # noqa: SIM118

    def stored(name: str) -> str:
        return "model.embed_tokens.weight" if name == "lm_head.weight" and name not in where else name  # tied

    def read(name: str) -> torch.Tensor | None:
        name = stored(name)
        if name not in where:
            return None
        with safe_open(where[name][0], framework="pt") as reader:
            return reader.get_tensor(name).float()

    head = where.get(stored("lm_head.weight"))
    return read, None if head is None else head[1]


def exact_decoders() -> dict:
    """{GGUF type: raw rows -> float32 weight} of the K-quants through their C++ packers (the `gguf`
    package's values exactly, and faster), where the fused kernels are built."""
    if kernels.fused_ops() is None:
        return {}
    return {
        "Q4_K": lambda rows: Q4KLinear.from_gguf(rows).dequantized(),
        "Q6_K": lambda rows: W6A8Linear.from_gguf(rows).dequantized(),
    }


def float32_source(loaded: LoadedModel):
    """(name, rows=None -> float32 weight (or its output `rows` only), a description of the source)."""
    params = dict(loaded.model.named_parameters())
    params.setdefault("lm_head.weight", loaded.model.get_output_embeddings().weight)

    def own(name: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        w = params[name].detach()
        return (w if rows is None else w[rows]).float()  # the rows picked before a float copy

    if loaded.model.dtype in (torch.float32, torch.float64):
        return own, f"the model's {loaded.model.dtype} weights"
    checkpoint = checkpoint_reader(loaded.source)
    if checkpoint is not None and checkpoint[1] in ("F32", "F64"):
        read = checkpoint[0]

        def weight(name: str, rows: torch.Tensor | None = None) -> torch.Tensor:
            found = read(name)
            return own(name, rows) if found is None else (found if rows is None else found[rows])

        return (
            weight,
            f"the torch.{ {'F32': 'float32', 'F64': 'float64'}[checkpoint[1]] } checkpoint in {loaded.source}",
        )
    if loaded.gguf is not None:  # a bf16 folder converted from a GGUF: its blocks are the finer copy
        blocks = gguf_float_reader(loaded.gguf, loaded.model.config, exact_decoders())
        if not loaded.trained:
            return blocks, f"{loaded.gguf.name}'s blocks, dequantized"
        return (
            lambda name, rows=None: own(name, rows) if name in loaded.trained else blocks(name, rows)
        ), f"{loaded.gguf.name}'s blocks, dequantized, and {len(loaded.trained)} trained tensors"
    return own, f"its {loaded.model.dtype} weights (no finer copy)"
