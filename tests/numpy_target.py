"""A third `Target` backend in one file: a numpy forward of a (tiny) Hugging Face Llama, float64.

Everything runs in float64, norms and RoPE tables included, where Hugging Face's forward computes
its norms and RoPE tables in float32 whatever the model's dtype: logits agree to about 1e-5, not to
rounding; the lossless tests compare speculation with plain decoding on this same target.

It exists to prove that a backend is one file: it implements `quickdraft.runtime.target.Target`
(chains and token trees: positions, a mask over the new rows, `compact`) with nothing but numpy and
its own KV cache, and the lossless suite runs through the library's decoders on it unchanged
(tests/test_target_protocol.py). It reads no states (`reads_states` False), so drafters that read
the target's hidden states refuse it, as they refuse Hugging Face's forward.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from quickdraft.runtime.caches.cached_model import TokenCacheVerbs
from quickdraft.types import TargetOutput


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


class NumpyLlamaTarget(TokenCacheVerbs):
    """A LlamaForCausalLM (default RoPE, no biases, SiLU) run in numpy float64 over its own cache.

    Args:
        model: the Hugging Face model whose weights are copied (float64 numpy arrays).
        vocab_size: logits are cut to this many columns (default: the config's).
    """

    runtime = "numpy"
    supports_trees = True
    reads_states = False
    supports_batches = False

    def __init__(self, model, vocab_size: int | None = None) -> None:
        cfg = model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps, self._context = cfg.rms_norm_eps, cfg.max_position_embeddings
        self.vocab_size = vocab_size or cfg.vocab_size
        inner = model.model
        self.embed, self.norm, self.head = (
            _np(inner.embed_tokens.weight),
            _np(inner.norm.weight),
            _np(model.lm_head.weight),
        )
        self.layers = [
            {
                "attn_norm": _np(b.input_layernorm.weight),
                "q": _np(b.self_attn.q_proj.weight),
                "k": _np(b.self_attn.k_proj.weight),
                "v": _np(b.self_attn.v_proj.weight),
                "o": _np(b.self_attn.o_proj.weight),
                "mlp_norm": _np(b.post_attention_layernorm.weight),
                "gate": _np(b.mlp.gate_proj.weight),
                "up": _np(b.mlp.up_proj.weight),
                "down": _np(b.mlp.down_proj.weight),
            }
            for b in inner.layers
        ]
        base = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
        self.inv_freq = 1.0 / (base ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim))
        # the cache: per layer (kv_heads, length, head_dim) keys and values
        self.k = [np.zeros((self.kv_heads, 0, self.head_dim)) for _ in self.layers]
        self.v = [np.zeros((self.kv_heads, 0, self.head_dim)) for _ in self.layers]
        self.tokens: list[int] = []
        self.num_forwards = 0
        self._block_start = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def max_length(self) -> int:
        return self._context

    def reset(self) -> None:
        self.rollback(0)

    def twin(self) -> NumpyLlamaTarget:
        twin = copy.copy(self)
        twin.tokens, twin.num_forwards = [], 0
        twin.reset()
        return twin

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        del self.tokens[length:]
        self.k = [k[:, :length] for k in self.k]
        self.v = [v[:, :length] for v in self.v]

    def compact(self, keep: Sequence[int]) -> None:
        start = self._block_start
        rows = [start + int(i) for i in keep]
        if any(r >= self.length or r < start for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"compact: rows {list(keep)} are not increasing rows of the last forward")
        idx = list(range(start)) + rows
        self.k = [k[:, idx] for k in self.k]
        self.v = [v[:, idx] for v in self.v]
        self.tokens = self.tokens[:start] + [self.tokens[r] for r in rows]

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """RMSNorm in float64 (Hugging Face's runs in float32 whatever the model's dtype)."""
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """RoPE on (heads, n, d) at positions (n,)."""
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def forward(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
        keep_hidden: Sequence[int] = (),
        shallow: torch.Tensor | None = None,
        features: bool = False,
    ) -> TargetOutput:
        if keep_hidden or features or shallow is not None:
            raise ValueError("the numpy target keeps no states")
        n, at = len(tokens), self.length
        pos = np.arange(at, at + n, dtype=np.float64) if positions is None else np.asarray(positions, np.float64)
        new = np.tril(np.ones((n, n), bool)) if tree_mask is None else tree_mask.cpu().numpy().astype(bool)
        mask = np.concatenate([np.ones((n, at), bool), new], axis=1)  # (n, at + n)
        x = self.embed[list(tokens)]
        group = self.heads // self.kv_heads
        for i, w in enumerate(self.layers):
            h = self._rms(x, w["attn_norm"])
            q = (h @ w["q"].T).reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
            k = (h @ w["k"].T).reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            v = (h @ w["v"].T).reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.k[i] = np.concatenate([self.k[i], k], axis=1)
            self.v[i] = np.concatenate([self.v[i], v], axis=1)
            keys, values = np.repeat(self.k[i], group, axis=0), np.repeat(self.v[i], group, axis=0)
            scores = q @ keys.transpose(0, 2, 1) / np.sqrt(self.head_dim)  # (heads, n, at + n)
            scores = np.where(mask[None], scores, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            out = (scores / scores.sum(-1, keepdims=True)) @ values  # (heads, n, d)
            x = x + out.transpose(1, 0, 2).reshape(n, -1) @ w["o"].T
            h = self._rms(x, w["mlp_norm"])
            gate = h @ w["gate"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ w["up"].T)) @ w["down"].T
        x = self._rms(x[-1:] if last_only else x, self.norm)
        self._block_start = at
        self.num_forwards += 1
        self.tokens.extend(int(t) for t in tokens)
        return TargetOutput(torch.from_numpy(x @ self.head[: self.vocab_size].T))

    def extend(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.forward(tokens, last_only, positions, tree_mask).logits
