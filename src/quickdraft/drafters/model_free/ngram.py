"""Prompt lookup (n-gram matching): draft by copying what followed the latest earlier occurrence of
the context's last n tokens (Saxena 2023; transformers' prompt_lookup_num_tokens, vLLM's ngram).

No model, no cache, deterministic (no q rows): the verifier treats q as one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import Drafter, DraftRequest, draft_path
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec
from quickdraft.drafters.spec import int_arg
from quickdraft.drafters.tree import lookup_tree
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.tree import TokenTree


def ngram_sizes(arg: str | None) -> tuple[int, int]:
    """(longest, shortest) n-gram of "N" or "N:M" (default 3 and 1)."""
    longest, _, shortest = (arg or "").partition(":")
    hi, lo = int_arg("ngram", longest or None, 3), int_arg("ngram", shortest or None, 1)
    if lo > hi:
        raise QuickdraftError(f"drafter 'ngram:{arg}': the shortest n-gram ({lo}) exceeds the longest ({hi})")
    return hi, lo


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


class PromptLookupDrafter(Drafter):
    """Drafter wrapper around `prompt_lookup` (name "ngram"); model-free (no step cost)."""

    drafts_trees = True
    drafts_ahead = True  # host lookups: a fork drafts for a guessed context (decoding/ahead.py)

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise QuickdraftError(f"n-gram sizes need 1 <= min <= max, got min={min_ngram} max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = "ngram"

    def fork(self) -> PromptLookupDrafter:
        """Stateless: every row can share this one."""
        return self

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """The continuation of the latest match (a chain), or of several earlier matches as a trie (a
        tree); deterministic: no q."""
        if request.shape is not None:
            return lookup_tree(context, request.shape, self.max_ngram, self.min_ngram)
        if request.budget < 1:
            return TokenTree()
        return draft_path(prompt_lookup(context, request.budget, self.max_ngram, self.min_ngram))


def ngram_drafter(sizes: str | None | tuple[int, int]) -> PromptLookupDrafter:
    """The prompt-lookup drafter for the "N" or "N:M" after "ngram:", or its (longest, shortest) n-gram."""
    longest, shortest = sizes if isinstance(sizes, tuple) else ngram_sizes(sizes)
    return PromptLookupDrafter(max_ngram=longest, min_ngram=shortest)


def _export(spec: DrafterSpec, num_draft_tokens: int, draft_dir: str | None) -> dict:
    longest, shortest = spec.value
    return {
        "method": "ngram",
        "num_speculative_tokens": num_draft_tokens,
        "prompt_lookup_max": longest,
        "prompt_lookup_min": shortest,
    }


KIND = DrafterKind(
    name="ngram",
    usage="ngram[:N[:M]]",
    summary="prompt lookup, longest N and shortest M n-gram (default 3 and 1)",
    build=lambda spec, target, dtype, runtime: ngram_drafter(spec.value),
    parse_arg=ngram_sizes,
    hf_prompt_lookup=True,
    has_model=False,
    drafts_trees=True,
    export=_export,
)
