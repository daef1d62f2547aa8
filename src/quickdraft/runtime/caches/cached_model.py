"""CachedModel: the single owner of one causal LM and its KV cache.

It is the only object that calls `model(...)` for inference. It remembers which token ids its cache
holds, so callers roll back by length and `sync` can reconcile the cache with any committed
sequence (longest common prefix, then extend). Logits are sliced to the shared vocabulary size.

A draft may restrict its LM head to K frequent token ids (`head_ids`): the decoder runs as usual,
the head multiplies only those K rows (on a CPU the full head of a small draft costs as much as
several of its layers), and every other token gets logit -inf, i.e. q = 0. The q it drafts from is
then the softmax over the K tokens, which the acceptance rule handles like any other q: lossless.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from quickdraft.errors import QuickdraftError
from quickdraft.prompts import context_length
from quickdraft.runtime.caches.kv_cache import cache_length, crop, kv_bytes_per_token, new_cache
from quickdraft.types import TargetOutput


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    return next(i for i in range(n) if a[i] != b[i])  # rare: the slow scan


def check_head_ids(head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(K,) int64 head ids, or a clear error unless they are non-empty ids below vocab_size."""
    ids = head_ids.to(torch.long)
    if ids.numel() == 0 or int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise QuickdraftError(f"head_ids must be non-empty token ids below {vocab_size}")
    return ids


def scatter_head(sub: torch.Tensor, head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(n, K) logits of a restricted head -> (n, V) logits, -inf off `head_ids` (q = 0 there)."""
    logits = torch.full((sub.shape[0], vocab_size), float("-inf"), dtype=sub.dtype, device=sub.device)
    logits[:, head_ids] = sub
    return logits


class TokenCacheVerbs:
    """The verbs every cache owner shares, written once on top of its own `extend`, `rollback`,
    `reset` and `tokens` (the ids its cache holds): `prefill` and `sync`; and what it declares it
    can do beyond chains (decoders read these, never probe).

    Attributes:
        supports_trees: `extend` takes positions and a tree mask, and `compact` keeps a row subset.
        reads_states: `extend` keeps hidden states (`keep_hidden`, `features`) and runs shallow
            passes (`extend_shallow`), which drafters that read the target need.
    """

    supports_trees = False
    reads_states = False
    supports_batches = False

    def prefill(self, tokens: Sequence[int], **extend_options) -> torch.Tensor:
        """Reset, then run the prompt; returns (1, V) logits of the last prompt position."""
        self.reset()
        return self.extend(tokens, last_only=True, **extend_options)

    @property
    def kv_bytes(self) -> int:
        """Bytes its KV cache holds now: its positions times `kv_bytes_per_token` of its model."""
        return self.length * kv_bytes_per_token(self.model)

    def shared_prefix(self, context: Sequence[int]) -> int:
        """How many leading cached ids equal `context`'s, at most all but its last (the last token is
        always run again: its row is the one a sync returns)."""
        limit = min(self.length, len(context) - 1)
        return shared_length(self.tokens[:limit], context[:limit])

    def sync(self, context: Sequence[int], last_only: bool = True) -> torch.Tensor:
        """Make the cache hold `context` and return the logits of its last position.

        Keeps the longest common prefix with what is cached (always re-running at least the last
        token, whose logits are returned), rolls back the rest, and extends.

        Args:
            context: the committed token ids (len >= 1).

        Returns:
            (1, V) logits predicting the token after `context` (all fed rows if not last_only).
        """
        keep = self.shared_prefix(context)
        self.rollback(keep)
        return self.extend(context[keep:], last_only=last_only)


class CachedModel(TokenCacheVerbs):
    """One model + one KV cache, with prefill/extend/rollback verbs (Hugging Face's forward): the
    `hf` implementation of `models.target.Target` (chains only; no states).

    Args:
        model: an unmodified Hugging Face causal LM (eval mode).
        vocab_size: logits are cut to this many columns (drops a padded vocabulary tail).
        head_ids: (K,) token ids (< vocab_size) the LM head is restricted to; None = all.
    """

    runtime = "hf"

    def __init__(
        self, model: PreTrainedModel, vocab_size: int | None = None, head_ids: torch.Tensor | None = None
    ) -> None:
        self.model = model.eval()
        self.vocab_size = vocab_size or int(model.config.vocab_size)
        self.cache = new_cache(model)
        self.tokens: list[int] = []
        self.num_forwards = 0
        self.head_ids = None if head_ids is None else check_head_ids(head_ids, self.vocab_size)
        self._head_rows: torch.Tensor | None = None
        if self.head_ids is not None:
            head = model.get_output_embeddings()
            cfg = model.config
            if getattr(head, "bias", None) is not None or getattr(cfg, "final_logit_softcapping", None):
                raise QuickdraftError(f"a restricted LM head needs a plain linear head ({cfg.model_type} is not)")
            self._head_rows = head.weight.detach()[self.head_ids].contiguous()  # (K, H)

    @property
    def length(self) -> int:
        """Number of positions in the cache."""
        return len(self.tokens)

    @property
    def max_length(self) -> int:
        return context_length(self.model)

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.tokens = []

    def twin(self) -> CachedModel:
        """A second owner of this model: the same weights, its own empty cache."""
        twin = copy.copy(self)
        twin.cache, twin.tokens, twin.num_forwards = new_cache(self.model), [], 0
        return twin

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
        """`extend` as a `TargetOutput` (logits only): this runtime runs chains and keeps no states."""
        if positions is not None or tree_mask is not None or shallow is not None:
            raise QuickdraftError("token trees and shallow passes need the native runtime (--runtime auto|native)")
        if keep_hidden or features:
            raise QuickdraftError("drafters that read the target's states need the native runtime")
        return TargetOutput(self.extend(tokens, last_only))

    def compact(self, keep: Sequence[int]) -> None:
        raise QuickdraftError("token trees need the native runtime (--runtime auto|native)")

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
        if self._head_rows is not None:
            logits = self._restricted_head(ids, last_only)
        else:
            out = self.model(
                input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0
            )
            logits = out.logits[0, :, : self.vocab_size]
        self.num_forwards += 1
        self.tokens.extend(int(t) for t in tokens)
        return logits

    def _restricted_head(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Decoder forward, then the head on the K kept rows: (n, V) logits, -inf off head_ids."""
        hidden = self.model.get_decoder()(input_ids=ids, past_key_values=self.cache, use_cache=True).last_hidden_state
        hidden = hidden[0, -1:] if last_only else hidden[0]  # (n, H)
        return scatter_head(hidden @ self._head_rows.T, self.head_ids, self.vocab_size)  # (n, K) -> (n, V)

    def rollback(self, length: int) -> None:
        """Drop every cached position from `length` on (0 <= length <= self.length)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        if length < self.length:
            crop(self.cache, length)
            del self.tokens[length:]
        assert cache_length(self.cache) == self.length
