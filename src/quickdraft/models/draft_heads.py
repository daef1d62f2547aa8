"""Trainable draft modules that reuse the target: the Kangaroo adapter and the EAGLE-style feature head.

Both are one small attention block of the target's shape; the token embedding and the LM head are
the target's own (frozen, not stored). The same modules train (batched, teacher-forced: `distill/`)
and draft (one sequence, incrementally, over a one-layer `KVCache` owned by the drafter); the block is
the native target's (`llama_block.Block`: one Llama block, one RoPE, one cache protocol).

- `KangarooAdapter` (Kangaroo, arXiv 2404.18911): the state after the target's first l layers ->
  h + Attn(RMSNorm(h)) -> its own RMSNorm -> the LM head. No MLP.
- `FeatureHead` (EAGLE, arXiv 2401.15077): [target feature f_t, embedding of x_{t+1}] -> a linear
  fusion -> one decoder layer (attention + MLP) -> the predicted feature f_{t+1} -> the LM head. A
  feature is the target's final-normed last hidden state, what its LM head reads.

The files a trained module ships in are written and read by `models/head_files.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.forward.llama_block import Block, causal_mask, rope_tables
from quickdraft.runtime.kernels.linear import Linear, fuse_rows, packs


@dataclass
class DraftHeadConfig:
    """Shape of a draft module; copied from the target's config (`from_target`).

    kind: "kangaroo" (adapter, no MLP) or "head" (feature head, with MLP and the fusion layer).
    exit_layer: Kangaroo's early-exit layer l (the adapter reads the state after layers [0, l)).
    """

    kind: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    vocab_size: int
    exit_layer: int = 0
    block: int = 0  # SpecDec: draft tokens per forward (mask queries)

    @classmethod
    def from_target(cls, model, kind: str, exit_layer: int = 2, block: int = 4) -> DraftHeadConfig:
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        if kind == "kangaroo" and not 1 <= exit_layer < int(cfg.num_hidden_layers):
            raise QuickdraftError(f"exit layer {exit_layer} outside [1, {int(cfg.num_hidden_layers) - 1}]")
        return cls(
            kind=kind,
            hidden=int(cfg.hidden_size),
            heads=int(cfg.num_attention_heads),
            kv_heads=int(cfg.num_key_value_heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
            intermediate=int(cfg.intermediate_size) if kind != "kangaroo" else 0,
            eps=float(cfg.rms_norm_eps),
            rope_theta=theta,
            vocab_size=int(model.get_output_embeddings().weight.shape[0]),
            exit_layer=exit_layer if kind == "kangaroo" else 0,
            block=block if kind == "specdec" else 0,
        )


def block_cache(cfg: DraftHeadConfig, dtype, device, capacity: int = 512) -> KVCache:
    """The one attention block's cache for one sequence (a one-layer `KVCache`)."""
    return KVCache(1, cfg.kv_heads, cfg.head_dim, dtype, device, capacity)


class DraftBlock(nn.Module):
    """One Llama decoder block (RMSNorm, GQA attention with RoPE, optional SwiGLU MLP)."""

    def __init__(self, cfg: DraftHeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.head_dim
        self.attn_norm = nn.RMSNorm(h, eps=cfg.eps)
        self.wq = nn.Linear(h, cfg.heads * d, bias=False)
        self.wk = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wv = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, h, bias=False)
        if cfg.intermediate:
            self.mlp_norm = nn.RMSNorm(h, eps=cfg.eps)
            self.gate = nn.Linear(h, cfg.intermediate, bias=False)
            self.up = nn.Linear(h, cfg.intermediate, bias=False)
            self.down = nn.Linear(cfg.intermediate, h, bias=False)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.frozen: Block | None = None  # `pack`: the drafting block

    def block(self) -> Block:
        """This module's weights as the shared Llama block (`llama_block.Block`): the same arithmetic
        as the native target's layers (the packed copy made by `pack` when not computing gradients)."""
        if self.frozen is not None and not torch.is_grad_enabled():
            return self.frozen
        return self._block(lambda m: m)

    def pack(self) -> None:
        """Freeze the block for drafting: its linears as the target's are (`runtime/kernels/linear.py`: on a
        bf16 CPU oneDNN's pre-packed kernel where it measures faster on this host, q/k/v and gate/up
        fused into one call each). The copies do not follow later changes of the weights."""
        pack = packs(self.wq.weight)
        self.frozen = self._block(lambda m: Linear(m.weight.detach(), pack), fuse=fuse_rows)

    def _block(self, linear, fuse=list) -> Block:
        cfg, mlp = self.cfg, bool(self.cfg.intermediate)
        return Block(
            self.attn_norm.weight,
            fuse([linear(self.wq), linear(self.wk), linear(self.wv)]),
            linear(self.wo),
            self.mlp_norm.weight if mlp else None,
            fuse([linear(self.gate), linear(self.up)]) if mlp else [],
            [cfg.intermediate, cfg.intermediate] if mlp else [],
            linear(self.down) if mlp else None,
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim,
            cfg.eps,
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: KVCache | None = None,
        mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, H) rows at `positions` (T,), causal among themselves; with `kv` (B = 1) they
        follow kv.length cached rows, are written there, and kv.length advances; `mask` (T, length
        + T) bool then replaces the causal rule (token trees); without `kv`, `mask` (B, 1, T, T)
        does. Returns (B, T, H), or without `kv` and with `rows` ((B, T) bool) only those rows,
        (N, H) (`Block.forward`)."""
        t = x.shape[1]
        cos, sin = rope_tables(self.inv_freq, positions, x.dtype)
        if kv is None:
            return self.block().forward(x, cos, sin, mask=mask, rows=rows)
        if rows is not None:
            raise ValueError("rows selects outputs of a cache-free forward (training) only")
        at = kv.length
        kv.ensure(at + t)
        if mask is None and t > 1:
            mask = causal_mask(t, at, x.device)
        out = self.block().forward(x[0], cos, sin, kv, 0, at, mask)[None]
        kv.length = at + t
        return out


class KangarooAdapter(nn.Module):
    """Kangaroo's adapter: (B, T, H) exit-layer states -> (B, T, H) states for the LM head."""

    kind = "kangaroo"
    # what training reads of these modules (training/train_heads.py), instead of switching on kinds:
    inputs = "shallow"  # the target's exit-layer states at every position
    unrolls = False  # the training-time test (TTT) unrolls only a head drafting on its own features
    regresses_features = False  # EAGLE's feature regression: only a module predicting features

    def __init__(self, cfg: DraftHeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.block = DraftBlock(cfg)
        self.out_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps)

    def init_layer(self, layers: int) -> int:
        """The target layer whose weights initialise the block: the exit layer."""
        return self.cfg.exit_layer

    def forward(
        self, shallow: torch.Tensor, positions: torch.Tensor, kv: KVCache | None = None, rows=None
    ) -> torch.Tensor:
        return self.out_norm(self.block(shallow, positions, kv, rows=rows))


class FeatureHead(nn.Module):
    """EAGLE's head: features f_t (B, T, H) and embeddings of x_{t+1} (B, T, H) -> predicted f_{t+1}."""

    kind = "head"
    inputs = "features"  # the target's last hidden states, fused with the next token's embedding
    unrolls = True
    regresses_features = True

    def __init__(self, cfg: DraftHeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fuse = nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.block = DraftBlock(cfg)
        self.frozen_fuse: Linear | None = None  # `for_inference`

    def init_layer(self, layers: int) -> int:
        """The target layer whose weights initialise the block: the last one."""
        return layers - 1

    def forward(
        self,
        features: torch.Tensor,
        next_embeds: torch.Tensor,
        positions: torch.Tensor,
        kv: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        frozen = self.frozen_fuse is not None and not torch.is_grad_enabled()
        fuse = self.frozen_fuse if frozen else self.fuse
        return self.block(fuse(torch.cat((features, next_embeds), dim=-1)), positions, kv, mask)


class BlockDrafter(FeatureHead):
    """SpecDec's Spec-Drafter ported to a decoder-only target: the feature head's rows over the
    committed prefix, then `block` learned mask queries after it, bidirectional among themselves and
    seeing the whole prefix; query j's output, through the LM head, drafts the j-th next token, so
    one forward drafts the whole block (non-autoregressive)."""

    kind = "specdec"
    inputs = "block"  # the head's inputs plus query rows at random cuts (training/train_heads.py)
    unrolls = False
    regresses_features = False  # its queries predict tokens, not features

    def __init__(self, cfg: DraftHeadConfig) -> None:
        super().__init__(cfg)
        self.queries = nn.Parameter(torch.randn(cfg.block, cfg.hidden) * 0.02)

    def query(self, count: int, positions: torch.Tensor, kv: KVCache, mask: torch.Tensor | None = None):
        """(1, count, H) outputs of the first `count` mask queries after the cached prefix."""
        return self.block(self.queries[:count][None], positions, kv, mask)


def for_inference(module: nn.Module) -> nn.Module:
    """A module frozen for drafting, in place, once it sits on its final device and dtype: eval mode,
    no gradients, and its linears packed as the target's are (`DraftBlock.pack`): a drafting round's
    head forwards read their weights after the target's forward has swept the caches, where unpacked
    bf16 linears ran slower than the packed kernel (profiled: docs/benchmarks.md). Not for training
    afterwards: the packed copies do not follow the weights."""
    module.eval().requires_grad_(False)
    for sub in module.modules():
        if isinstance(sub, DraftBlock):
            sub.pack()
    if isinstance(module, FeatureHead):
        weight = module.fuse.weight.detach()
        module.frozen_fuse = Linear(weight, packs(weight))
    return module


def init_from_target(module: nn.Module, model, layer: int) -> None:
    """Start a module's block from the target's decoder layer `layer` (its attention, norms and MLP);
    a feature head's fusion starts as the identity on the feature half."""
    block = model.model.layers[layer]
    own = module.block
    pairs = [
        (own.attn_norm.weight, block.input_layernorm.weight),
        (own.wq.weight, block.self_attn.q_proj.weight),
        (own.wk.weight, block.self_attn.k_proj.weight),
        (own.wv.weight, block.self_attn.v_proj.weight),
        (own.wo.weight, block.self_attn.o_proj.weight),
    ]
    if own.cfg.intermediate:
        pairs += [
            (own.mlp_norm.weight, block.post_attention_layernorm.weight),
            (own.gate.weight, block.mlp.gate_proj.weight),
            (own.up.weight, block.mlp.up_proj.weight),
            (own.down.weight, block.mlp.down_proj.weight),
        ]
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.copy_(theirs.to(mine.dtype))
        if isinstance(module, KangarooAdapter):
            module.out_norm.weight.copy_(model.model.norm.weight.to(module.out_norm.weight.dtype))
        if isinstance(module, FeatureHead):  # start as "the next feature is this one": zero branch outputs
            # (a BlockDrafter's queries then start near zero and learn from the prefix they read)
            own.wo.weight.zero_()
            own.down.weight.zero_()
            hidden = own.cfg.hidden
            module.fuse.weight.zero_()
            module.fuse.weight[:, :hidden] = torch.eye(hidden)
            module.fuse.weight[:, hidden:].normal_(0.0, 0.02)
