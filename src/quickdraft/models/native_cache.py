"""NativeCachedModel: the one owner of a native Llama forward and its static KV cache.

The same verbs as `CachedModel` (prefill and sync shared with it; extend, rollback, reset; logits cut to the shared
vocabulary, an optional restricted LM head), so decoders and drafters use either unchanged, plus
what speculation beyond chains needs: `extend` takes positions and a tree mask over the new rows and
can return hidden states; `compact` keeps a chosen subset of the rows just added (the accepted path
of a tree); rollback only sets a length (no copy, no reallocation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from quickdraft.models.cached_model import TokenCacheVerbs, check_head_ids, scatter_head
from quickdraft.models.native import NativeLlama


class NativeCachedModel(TokenCacheVerbs):
    """One Llama-family model run natively, with its static cache.

    Args:
        model: a Hugging Face LlamaForCausalLM (its weights are read in place).
        vocab_size: logits are cut to this many columns.
        head_ids: (K,) token ids the LM head is restricted to (q = 0 elsewhere); None = all.
    """

    runtime = "native"

    def __init__(self, model, vocab_size: int | None = None, head_ids: torch.Tensor | None = None) -> None:
        self.model = model.eval()
        self.net = NativeLlama(model)
        self.vocab_size = vocab_size or int(model.config.vocab_size)
        self.cache = self.net.new_cache()
        self.tokens: list[int] = []
        self.num_forwards = 0
        self.hidden: dict[int, torch.Tensor] = {}  # states kept by the last extend
        self._block_start = 0  # where the last extend's rows begin (for compact)
        self.head_ids = None if head_ids is None else check_head_ids(head_ids, self.vocab_size)
        if self.head_ids is not None:
            self.head = self.net.head[self.head_ids].contiguous()  # (K, H)
        else:
            self.head = self.net.head[: self.vocab_size]  # a view: drops a padded tail, no copy

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def max_length(self) -> int:
        return self.net.max_length

    def reset(self) -> None:
        self.tokens = []
        self.hidden = {}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, H) final-normed states -> (n, V) logits (-inf off a restricted head's ids)."""
        sub = F.linear(hidden, self.head)
        return sub if self.head_ids is None else scatter_head(sub, self.head_ids, self.vocab_size)

    @torch.inference_mode()
    def extend(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
        keep_hidden: Sequence[int] = (),
    ) -> torch.Tensor:
        """Append tokens to the cache and return their logits.

        Args:
            tokens: n >= 1 new token ids following the cached ones.
            last_only: the LM head on the last row only.
            positions: (n,) RoPE positions (default: consecutive after the cache).
            tree_mask: (n, n) bool, which new rows each new row attends to (default causal).
            keep_hidden: layers whose entering states to keep in `self.hidden` ((n, H) each).

        Returns:
            (n, V) logits, or (1, V) with last_only, in the model's dtype.
        """
        n, at = len(tokens), self.length
        self.cache.ensure(at + n)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.net.device)
        pos = None if positions is None else torch.tensor(list(positions), dtype=torch.long, device=self.net.device)
        x, self.hidden = self.net.forward(
            self.cache, at, ids, positions=pos, tree_mask=tree_mask, keep_hidden=keep_hidden
        )
        self._block_start = at
        self.num_forwards += 1
        self.tokens.extend(int(t) for t in tokens)
        return self.logits(x[-1:] if last_only else x)

    def rollback(self, length: int) -> None:
        """Drop every cached position from `length` on: a new length, nothing copied."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        del self.tokens[length:]

    @torch.inference_mode()
    def compact(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep` (indices into the last extend's rows, increasing) of the last
        extend, moved to follow the context in that order: the accepted path of a tree."""
        start = self._block_start
        rows = [start + int(i) for i in keep]
        if any(r >= self.length or r < start for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"compact: rows {list(keep)} are not increasing rows of the last extend")
        self.cache.move_rows(torch.tensor(rows, dtype=torch.long, device=self.net.device), start)
        self.tokens[start:] = [self.tokens[r] for r in rows]
