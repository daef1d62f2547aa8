"""The decoder families the native forward runs, described by their parts (as llama.cpp's table of
architectures, as mlx-lm's one small file per family on a shared block).

Each family is a `BlockStyle` (how its norms and MLP differ from Llama's) plus what `describe`
reads off the Hugging Face model itself: q/k norms (Qwen3, Gemma 3), the sandwich norms around
attention and MLP (Gemma 2/3), q/k/v biases (Qwen2), fused q/k/v and gate/up projections (Phi-3),
the embedding scale (Gemma), the attention scale (`query_pre_attn_scalar`), RoPE tables per layer
type (Gemma 3's local and global bases), sliding-window layers (Mistral, Gemma 2/3, Qwen2 when
it enables them) and Gemma 2's soft-capping (scores capped in an explicit attention product, since
SDPA cannot cap them; final logits capped after the LM head). RoPE scaling that is fixed per model
(linear, llama3, yarn: Hugging Face's rotary module already holds the scaled frequencies and
attention factor) runs as the default does. Phi-3's longrope has two sets of frequencies: a row at
position p uses the long factors once p + 1 > original_max_position_embeddings (what Hugging Face's
forward gives decoding one token at a time; its forward over a longer prompt in one call uses the
long factors for every row of that call), so verification rows equal plain decoding's. Scaling that
changes with the sequence otherwise (dynamic NTK) is not native, and `unsupported_reason` says so in
one line (the runtime then runs Hugging Face's forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.runtime.forward.block_parts import LLAMA, BlockStyle

FAMILIES: dict[str, BlockStyle] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "phi3": LLAMA,
    "gemma": BlockStyle(norm="gemma", act="gelu_tanh"),
    "gemma2": BlockStyle(norm="gemma", act="gelu_tanh"),
    "gemma3_text": BlockStyle(norm="gemma", act="gelu_tanh"),
}
FIXED_ROPE = ("default", "linear", "llama3", "yarn")  # what the rotary module's inv_freq already holds
NATIVE_ROPE = (*FIXED_ROPE, "longrope")  # longrope: the short and the long factors' tables, by position


def _ropes(cfg) -> list[dict]:
    """The RoPE parameter sets of a config (one per layer type where they differ by type)."""
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return list(rope.values())
    return [rope]


def unsupported_reason(model) -> str | None:
    """Why the native forward cannot run `model` (None: it can), in one line."""
    cfg = model.config
    if cfg.model_type not in FAMILIES:
        return f"model type {cfg.model_type!r} (native: {', '.join(sorted(FAMILIES))})"
    ropes = _ropes(cfg)
    for rope in ropes:
        if rope.get("rope_type", "default") not in NATIVE_ROPE:
            return f"RoPE scaling {rope.get('rope_type')!r} (native: {', '.join(NATIVE_ROPE)})"
        if rope.get("rope_type") == "longrope" and len(ropes) > 1:
            return "longrope per layer type"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "gelu_pytorch_tanh"):
        return f"MLP activation {act!r} (native: silu, gelu_pytorch_tanh)"
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if getattr(attn.o_proj, "bias", None) is not None or any(
        getattr(m, "bias", None) is not None for m in mlp.children() if isinstance(m, torch.nn.Linear)
    ):
        return "biases on the output projection or the MLP"
    return None


@dataclass
class LayerParts:
    """What one layer adds to the Llama block (`llama_block.Block`'s optional fields) and where it
    sits: its RoPE table (a layer type, "" for one table) and its sliding window (None: full)."""

    extras: dict
    rope: str
    window: int | None


def describe(model) -> tuple[BlockStyle, list[LayerParts], torch.Tensor | None]:
    """(the family's style, each layer's parts, the embedding scale or None) of a supported model."""
    cfg = model.config
    style = FAMILIES[cfg.model_type]
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    scalar = getattr(cfg, "query_pre_attn_scalar", None)
    q_scale = float(scalar) ** -0.5 * head_dim**0.5 if scalar else 1.0
    types = list(getattr(cfg, "layer_types", None) or [])
    rotary = model.model.rotary_emb
    per_type = bool(types) and getattr(rotary, f"{types[0]}_inv_freq", None) is not None
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    parts = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        extras: dict = {
            "style": style,
            "q_scale": q_scale,
            "attn_softcap": getattr(cfg, "attn_logit_softcapping", None),
        }
        if getattr(attn, "q_norm", None) is not None:
            extras.update(q_norm=attn.q_norm.weight, k_norm=attn.k_norm.weight)
        if getattr(layer, "pre_feedforward_layernorm", None) is not None:  # Gemma 2/3: a sandwich
            extras.update(post_attn_norm=layer.post_attention_layernorm.weight)
            extras.update(post_mlp_norm=layer.post_feedforward_layernorm.weight)
        projections = [getattr(attn, f"{n}_proj", None) for n in "qkv"]
        biases = [getattr(p, "bias", None) for p in projections]
        if any(b is not None for b in biases):  # Qwen2; a projection without one adds zeros
            pairs = zip(projections, biases, strict=True)
            parts_qkv = [b if b is not None else p.weight.new_zeros(p.weight.shape[0]) for p, b in pairs]
            extras.update(qkv_bias=torch.cat(parts_qkv))
        kind = types[i] if types else "full_attention"
        sliding = window if (kind == "sliding_attention" or (not types and window)) else None
        parts.append(LayerParts(extras, kind if per_type else "", int(sliding) if sliding else None))
    embed = model.model.embed_tokens
    scale = getattr(embed, "embed_scale", None)
    return style, parts, None if scale is None else scale.to(embed.weight.dtype)


def rope_sets(model) -> dict[str, tuple[torch.Tensor, float]]:
    """{layer type or "": (inv_freq (d/2,) float32, attention scaling)} from the rotary module."""
    rotary = model.model.rotary_emb
    types = sorted(set(getattr(model.config, "layer_types", None) or []))
    if types and getattr(rotary, f"{types[0]}_inv_freq", None) is not None:
        return {
            t: (getattr(rotary, f"{t}_inv_freq").float(), float(getattr(rotary, f"{t}_attention_scaling")))
            for t in types
        }
    inv_freq = getattr(rotary, "original_inv_freq", None)  # longrope may have swapped `inv_freq`
    inv_freq = rotary.inv_freq if inv_freq is None else inv_freq
    return {"": (inv_freq.float(), float(getattr(rotary, "attention_scaling", 1.0)))}


def long_ropes(model) -> dict[str, tuple[torch.Tensor, int]]:
    """{"": (the long factors' inv_freq (d/2,) float32, the first position that uses them)} for
    Phi-3's longrope (module docstring); empty for every other RoPE."""
    cfg = model.config
    ropes = _ropes(cfg)
    if len(ropes) != 1 or ropes[0].get("rope_type") != "longrope":
        return {}
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    start = int(ropes[0].get("original_max_position_embeddings") or cfg.original_max_position_embeddings)
    long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=start + 1)
    return {"": (long_freq.float(), start)}
