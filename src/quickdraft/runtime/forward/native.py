"""A native forward for Llama-family decoders over a static KV cache (gpt-fast's model.py, in size).

Hugging Face's forward pays per-call set-up (cache objects, mask builders, output dataclasses, hooks)
that dominates a small model's step on a CPU. This module reads the same weight tensors (no copy)
and runs the same arithmetic in the same order and dtypes (RMSNorm in float32, RoPE tables in
float32 cast to the model's dtype, SDPA attention), so logits agree with Hugging Face's to rounding
(tested: 1e-10 in float64). It adds what speculation needs: explicit positions (token trees), an
attention mask over the new rows, a layer range (start at layer l from given states) and the hidden
state entering any layer.

`NativeLlama.forward` is pure with respect to bookkeeping: the caller (`NativeCachedModel`, the one
owner of the cache) says where the new rows are written; the cache never reallocates per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise

import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.batch_cache import BatchKVCache
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.forward.block_parts import gemma_norm, lean_device
from quickdraft.runtime.forward.families import describe, long_ropes, rope_sets, unsupported_reason
from quickdraft.runtime.forward.llama_block import Block, add_norm, rope_tables
from quickdraft.runtime.kernels.fused_layers import LayerKernels
from quickdraft.runtime.kernels.linear import Linear, fuse_rows, packs

__all__ = ["NativeLlama", "unsupported_reason"]


class NativeLlama:
    """The forward of a Hugging Face decoder of a described family (`families.py`: Llama, Mistral,
    Qwen2/3, Phi-3, Gemma 3), reading its weights in place.

    Args:
        model: the Hugging Face model.
        linears: kernel-form linears by parameter name (e.g. "model.layers.0.mlp.up_proj.weight",
            "lm_head.weight"), e.g. int4 ones from runtime/quant/quantized.py; the others read the weights.
    """

    def __init__(self, model, linears: Mapping[str, Callable] | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the native runtime does not support this model: {reason}")
        cfg, inner = model.config, model.model
        self.num_layers = int(cfg.num_hidden_layers)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.eps = float(cfg.rms_norm_eps)
        self.max_length = int(cfg.max_position_embeddings)
        self.embed = inner.embed_tokens.weight
        self.dtype, self.device = self.embed.dtype, self.embed.device
        # bf16 on CPU: oneDNN's packed kernel where it measures faster on this host (runtime/kernels/linear.py)
        pack = packs(self.embed)
        self.packed = pack
        given = dict(linears or {})

        def linear(name: str, module) -> Callable:
            return given.pop(name, None) or Linear(module.weight, pack)

        self.style, parts, self.embed_scale = describe(model)
        self.windows = [p.window for p in parts]
        self.rope_keys = [p.rope for p in parts]
        self.layers = []
        for i, (block, part) in enumerate(zip(inner.layers, parts, strict=True)):
            attn, mlp, at = block.self_attn, block.mlp, f"model.layers.{i}."
            if getattr(attn, "qkv_proj", None) is not None:  # Phi-3: one fused projection
                qkv = [linear(at + "self_attn.qkv_proj.weight", attn.qkv_proj)]
            else:
                qkv = fuse_rows([linear(at + f"self_attn.{n}_proj.weight", getattr(attn, f"{n}_proj")) for n in "qkv"])
            if getattr(mlp, "gate_up_proj", None) is not None:
                gate_up, sizes = (
                    [linear(at + "mlp.gate_up_proj.weight", mlp.gate_up_proj)],
                    [mlp.down_proj.in_features] * 2,
                )
            else:
                gate_up = fuse_rows(
                    [linear(at + f"mlp.{n}_proj.weight", getattr(mlp, f"{n}_proj")) for n in ("gate", "up")]
                )
                sizes = [mlp.gate_proj.weight.shape[0], mlp.up_proj.weight.shape[0]]
            mlp_norm = getattr(block, "pre_feedforward_layernorm", None)  # Gemma: the sandwich's pre-MLP norm
            mlp_norm = block.post_attention_layernorm if mlp_norm is None else mlp_norm
            self.layers.append(
                Block(
                    block.input_layernorm.weight,
                    qkv,
                    linear(at + "self_attn.o_proj.weight", attn.o_proj),
                    mlp_norm.weight,
                    gate_up,
                    sizes,
                    linear(at + "mlp.down_proj.weight", mlp.down_proj),
                    self.heads,
                    self.kv_heads,
                    self.head_dim,
                    self.eps,
                    **part.extras,
                )  # fmt: skip
            )
        self.head_linear = given.pop("lm_head.weight", None)  # None: the cache owner builds it
        if given:
            raise ValueError(f"NativeLlama: no linear named {sorted(given)[0]!r} in this model")
        self.norm = inner.norm.weight
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None)  # logits c * tanh(z / c) (Gemma 2)
        self.head = model.lm_head.weight  # (V, H); tied models share the embedding's storage
        self.ropes = {k: (f.to(self.device), scale) for k, (f, scale) in rope_sets(model).items()}
        self.long_ropes = {k: (f.to(self.device), start) for k, (f, start) in long_ropes(model).items()}
        self.kernel_layers = LayerKernels(self.layers, self.windows, self.rope_keys)  # plain blocks: one C++ call a run
        # a batch's masks may go to SDPA as additive float masks: no capped scores read them as bools
        self.additive_masks = all(layer.attn_softcap is None for layer in self.layers)

    def new_cache(self, capacity: int = 512) -> KVCache:
        return KVCache(
            self.num_layers, self.kv_heads, self.head_dim, self.dtype, self.device, capacity, self.max_length
        )

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The family's final norm with this model's epsilon (Llama's: `llama_block.add_norm`, the fused
        kernel where it runs)."""
        if self.style.norm == "gemma":
            return gemma_norm(x, weight, self.eps)
        return add_norm(x, weight, self.eps)[1]

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of `ids`, scaled as the family scales them (Gemma: by sqrt(H))."""
        x = self.embed[ids]
        return x if self.embed_scale is None else x * self.embed_scale

    def tables(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{RoPE table key: (cos, sin) at `positions`}, one per layer type that has its own (longrope:
        the long factors' rows where a position has reached them; no read back from the device)."""
        out = {k: rope_tables(f, positions, self.dtype, scale) for k, (f, scale) in self.ropes.items()}
        for k, (f, start) in self.long_ropes.items():
            far = (positions >= start)[:, None]
            (cos, sin), (long_cos, long_sin) = out[k], rope_tables(f, positions, self.dtype, self.ropes[k][1])
            out[k] = (torch.where(far, long_cos, cos), torch.where(far, long_sin, sin))
        return out

    def forward(
        self,
        cache: KVCache,
        at: int,
        ids: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        layers: tuple[int, int] | None = None,
        keep_hidden: Sequence[int] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run layers [start, stop) over n new rows written at cache positions at..at+n.

        Args:
            cache: the keys/values; rows before `at` are the context the new rows attend to.
            at: cache position of the first new row (its capacity must hold at + n).
            ids: (n,) token ids (start == 0), or
            hidden: (n, H) the states entering layer `start`.
            positions: (n,) RoPE positions (default at..at+n-1; a tree gives depths).
            tree_mask: (n, n) bool, which new rows each new row sees (default causal; every row
                sees all of the context), or (n, at + n) over the context and the new rows.
            layers: (start, stop), default all.
            keep_hidden: layer indices whose entering state to return (num_layers = the last
                layer's output, before the final norm).

        Returns:
            ((n, H) the output of layer stop-1 (final-normed when stop == num_layers), {layer: (n, H)}).
        """
        start, stop = layers or (0, self.num_layers)
        x = self.embed_ids(ids) if hidden is None else hidden
        n = x.shape[0]
        if positions is None:
            positions = torch.arange(at, at + n, device=self.device)
        tables = self.tables(positions)
        mask = None
        if tree_mask is not None and tree_mask.shape[1] == at + n:  # a mask over context and new rows
            mask = tree_mask.to(self.device)
        elif tree_mask is not None or n > 1:  # over the new rows; the context is visible to all
            new = tree_mask if tree_mask is not None else torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            mask = torch.cat([torch.ones(n, at, dtype=torch.bool, device=self.device), new.to(self.device)], dim=1)
        if mask is not None and n == 1 and bool(mask.all()):
            mask = None  # one row that sees everything: the unmasked kernel, as a plain step
        kept: dict[int, torch.Tensor] = {}
        if self.kernel_layers.runs(x, cache, start, stop):  # one C++ call per run of layers between kept states
            cos, sin = tables[self.rope_keys[start]]
            bounds = sorted({start, stop, *(k for k in keep_hidden if start < k < stop)})
            for a, b in pairwise(bounds):
                if a in keep_hidden:
                    kept[a] = x
                x = self.kernel_layers(x, cache, a, b, at, cos, sin, mask)
            return self._finish(x, stop, keep_hidden, kept)
        windowed = {w: window_mask(mask, at, positions, w) for w in set(self.windows[start:stop]) if w}
        for i in range(start, stop):
            if i in keep_hidden:
                kept[i] = x
            cos, sin = tables[self.rope_keys[i]]
            w = self.windows[i]
            x = self.layers[i].forward(x, cos, sin, cache, i, at, windowed[w] if w else mask)
        return self._finish(x, stop, keep_hidden, kept)

    def _finish(self, x: torch.Tensor, stop: int, keep_hidden, kept: dict) -> tuple[torch.Tensor, dict]:
        if stop in keep_hidden:
            kept[stop] = x
        if stop == self.num_layers:
            x = self.rms_norm(x, self.norm)
        return x, kept

    def forward_lone(
        self, cache: BatchKVCache, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """`forward_batch` over a batch of one running row ((1, T) ids and positions, (1, T, span) mask):
        the one-sequence forward over its cache row (`BatchKVCache.row`; one C++ call for the layers where
        it runs), the same bits as the batched layers, at about half a small model's batched step."""
        at, t = cache.lengths[0], ids.shape[1]
        h, _ = self.forward(cache.row(0), at, ids=ids[0], positions=positions[0], tree_mask=mask[0, :, : at + t])
        return h[None]

    def forward_batch(
        self, cache: BatchKVCache, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """All layers over (B, T) new rows of the cache's B running sequences (padded to T), row b's
        written at cache.lengths[b].. (`cache.begin(T)` first).

        Args:
            ids: (B, T) token ids.
            positions: (B, T) RoPE positions.
            mask: (B, T, span) bool, which cache positions each new row sees (its own context and
                new rows only; a padding row must see at least itself).

        Returns:
            (B, T, H) final-normed states.
        """
        b, t = ids.shape
        x = self.embed_ids(ids)
        tables = {k: (c.view(b, t, -1), s.view(b, t, -1)) for k, (c, s) in self.tables(positions.reshape(-1)).items()}
        mask = mask.to(self.device)
        masks = {w: batch_window_mask(mask, cache.starts, positions, w) for w in set(self.windows) if w}
        masks[None] = mask
        masks = {w: m[:, None] for w, m in masks.items()}  # (B, 1, T, span): one head dimension
        if lean_device(x) and self.additive_masks and not kernels.usable(x):  # SDPA's own bool conversion, once
            # a forward, not a layer (the fused kernels read bool masks)
            masks = {w: torch.zeros_like(m, dtype=x.dtype).masked_fill_(~m, float("-inf")) for w, m in masks.items()}
        cache.index = None  # the write index: made by the first layer
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            x = layer.forward(x, cos, sin, cache, i, cache.starts, masks[self.windows[i] or None])
        return self.rms_norm(x, self.norm)


def batch_window_mask(mask: torch.Tensor, starts: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """A batch's (B, T, span) `mask` narrowed to a sliding window: row b's cached context holds
    positions 0..starts[b]-1 in order and its new rows, written at starts[b].., are at `positions`
    (B, T); a row at position p sees keys at positions > p - window (a padding row still sees itself).
    No read back from the device: it runs inside a captured CUDA graph (runtime/forward/graphs.py)."""
    b, t = positions.shape
    keys = torch.arange(mask.shape[-1], device=mask.device).repeat(b, 1)  # (B, span) key positions
    cols = starts.to(mask.device)[:, None] + torch.arange(t, device=mask.device)
    keys.scatter_(1, cols, positions.to(mask.device))
    return mask & (keys[:, None, :] > positions.to(mask.device)[:, :, None] - window)


def window_mask(mask: torch.Tensor | None, at: int, positions: torch.Tensor, window: int) -> torch.Tensor | None:
    """`mask` ((n, at + n) bool over the cache and the new rows; None: all visible) narrowed to a
    sliding window: a row at position p sees keys at positions > p - window (the cached context holds
    positions 0..at-1 in order, the new rows `positions`). None when nothing falls outside."""
    n = positions.shape[0]
    if int(positions.max()) < window:
        return mask
    keys = torch.cat([torch.arange(at, device=positions.device), positions])
    near = keys[None, :] > positions[:, None] - window
    full = torch.ones(n, at + n, dtype=torch.bool, device=positions.device) if mask is None else mask
    return full & near
