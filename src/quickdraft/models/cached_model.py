"""CachedModel: the single owner of one causal LM and its KV cache.

It is the only object that calls `model(...)` for inference. It remembers which token ids its cache
holds, so callers roll back by length and `sync` can reconcile the cache with any committed
sequence (longest common prefix, then extend). Logits are sliced to the shared vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from quickdraft.models.kv_cache import cache_length, crop, new_cache


class CachedModel:
    """One model + one KV cache, with prefill/extend/rollback verbs.

    Args:
        model: an unmodified Hugging Face causal LM (eval mode).
        vocab_size: logits are cut to this many columns (drops a padded vocabulary tail).
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = vocab_size or int(model.config.vocab_size)
        self.cache = new_cache(model)
        self.tokens: list[int] = []
        self.num_forwards = 0

    @property
    def length(self) -> int:
        """Number of positions in the cache."""
        return len(self.tokens)

    @property
    def max_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.tokens = []

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Append tokens to the cache and return their logits.

        Args:
            tokens: n >= 1 new token ids following the cached ones.
            last_only: compute the LM head for the last position only (prefill, drafting).

        Returns:
            (n, V) logits, or (1, V) with last_only, in the model's dtype.
        """
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.model.device)
        out = self.model(
            input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0
        )
        self.num_forwards += 1
        self.tokens.extend(int(t) for t in tokens)
        return out.logits[0, :, : self.vocab_size]

    def prefill(self, tokens: Sequence[int]) -> torch.Tensor:
        """Reset, then run the prompt; returns (1, V) logits of the last prompt position."""
        self.reset()
        return self.extend(tokens, last_only=True)

    def rollback(self, length: int) -> None:
        """Drop every cached position from `length` on (0 <= length <= self.length)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        if length < self.length:
            crop(self.cache, length)
            del self.tokens[length:]
        assert cache_length(self.cache) == self.length

    def sync(self, context: Sequence[int], last_only: bool = True) -> torch.Tensor:
        """Make the cache hold `context` and return the logits of its last position.

        Keeps the longest common prefix with what is cached (always re-running at least the last
        token, whose logits are returned), rolls back the rest, and extends.

        Args:
            context: the committed token ids (len >= 1).

        Returns:
            (1, V) logits predicting the token after `context` (all fed rows if not last_only).
        """
        limit = min(self.length, len(context) - 1)
        keep = limit
        if self.tokens[:limit] != list(context[:limit]):  # rare: the slow scan for the split point
            keep = next(i for i in range(limit) if self.tokens[i] != context[i])
        self.rollback(keep)
        return self.extend(context[keep:], last_only=last_only)
