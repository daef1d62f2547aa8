"""Prompt lookup (n-gram matching): draft by copying what followed the latest earlier occurrence of
the context's last n tokens (Saxena 2023; transformers' prompt_lookup_num_tokens, vLLM's ngram).

No model, no cache, deterministic (q_probs None): the verifier treats q as one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import KeepDrafting, empty_proposal
from quickdraft.errors import QuickdraftError
from quickdraft.types import Proposal
from quickdraft.verifiers.tree import TokenTree


def prompt_lookup(context: Sequence[int], num_draft_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation of the most recent earlier match of the longest matching suffix n-gram.

    Args:
        context: committed token ids.
        num_draft_tokens: at most this many tokens are returned.
        max_ngram, min_ngram: suffix lengths tried, longest first.

    Returns:
        Up to num_draft_tokens ids (empty when nothing matches).
    """
    ids = np.asarray(context, dtype=np.int64)
    total = len(ids)
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        # windows starting at i = 0 .. total-n-1 (a match must be followed by at least one token)
        windows = sliding_window_view(ids[: total - 1], n)
        hits = np.flatnonzero((windows == ids[total - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return ids[start : start + num_draft_tokens].tolist()
    return []


class PromptLookupDrafter:
    """Drafter wrapper around `prompt_lookup` (name "ngram")."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise QuickdraftError(f"n-gram sizes need 1 <= min <= max, got min={min_ngram} max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = "ngram"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def step_seconds(self) -> None:
        return None  # a lookup, no model: its cost is noise next to a forward

    def propose(
        self,
        context: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        if num_draft_tokens < 1:
            return empty_proposal()
        tokens = prompt_lookup(context, num_draft_tokens, self.max_ngram, self.min_ngram)
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q_probs=None)

    def propose_tree(self, context: Sequence[int], shape, sampling: SamplingConfig, generator) -> TokenTree:
        """The continuations of several earlier matches as a trie (deterministic: no q)."""
        from quickdraft.drafters.tree import lookup_tree

        return lookup_tree(context, shape, self.max_ngram, self.min_ngram)
