"""Suffix drafting: model-free token trees from the target's own text (SuffixDecoding, SAM-Decoding, REST).

Each round the drafter finds the longest suffix of the context (up to `max_match` tokens) in three
sources and reads what followed its occurrences:
  (a) the request's own prompt and output so far (the most recent `max_rows` occurrences);
  (b) a global datastore of the target's own generations (`drafters/model_free/suffix_index.py`; shipped for
      the default target, built for any target by `quickdraft build-datastore`);
  (c) optionally, a bounded cache of earlier requests' outputs (`cache=N` tokens; the server turns
      it on, the CLI and the bench leave it off unless the spec asks).
The continuations of one source form a frequency trie: a node's score is the fraction of that
source's occurrences whose continuation starts with the node's path (the product of empirical
conditional probabilities along it). Sources merge by the best score per path, and the `budget`
best nodes form the tree (a parent always scores at least as much as its child, so the selection is
prefix-closed). A chain (`--draft-length k`) is the greedy path through that tree.

Deterministic (the tree is a function of the context): greedy and sampled verification stay
lossless with the tree verifier's one-hot rule for deterministic siblings.

Spec: `suffix[:PATH][;cache=N][;match=M][;depth=D]` (PATH: a datastore folder; without it the one
shipped for the default target; `suffix:none` uses no datastore).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import Drafter, DraftRequest, draft_path
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec
from quickdraft.drafters.model_free.datastore import load_datastore, shipped_datastore
from quickdraft.drafters.model_free.suffix_index import SEP, SuffixIndex
from quickdraft.drafters.model_free.suffix_trie import (
    greedy_chain,
    merge_scores,
    paths_to_tree,
    scan_matches,
    top_scores,
    trie_scores,
)
from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import count, parse_options, positive
from quickdraft.verifiers.tree import TokenTree

CHAIN_TREE_FACTOR = 4  # a chain of k tokens is read from a tree of k * this many nodes
# Expected tokens per target forward by tree budget (greedy, the default target's held-out SeqKD
# prompts, 13 x 64 tokens: scripts/suffix_offline.py on docs/bench/heldout-reuse), the gain side of
# the host-sized budget (`draft_tree` auto, costs/cost_curve.py); only the curve's shape matters.
SUFFIX_OPTIONS = {"cache": count, "match": positive, "depth": positive, "rows": positive}
TREE_GAIN = {1: 1.50, 4: 2.07, 8: 2.30, 16: 2.47, 32: 2.59}


def parse_suffix(arg: str | None) -> tuple[str | None, dict[str, int]]:
    """`[PATH][;cache=N][;match=M][;depth=D]` -> (PATH or None, options): PATH a datastore folder
    (absent: the one shipped for the target; `none`: no datastore), cache the tokens of earlier
    requests' outputs kept (0 = off), match the longest suffix searched, depth the longest branch."""
    path, values = parse_options(f"drafter 'suffix:{arg}'", arg or "", SUFFIX_OPTIONS)
    names = {"cache": "cache", "match": "max_match", "depth": "depth", "rows": "max_rows"}
    return path, {names[key]: value for key, value in values.items()}


def with_suffix_cache(stages: tuple[DrafterSpec, ...], tokens: int) -> tuple[DrafterSpec, ...]:
    """Parsed drafter `stages` with `cache=tokens` added to their suffix stages that set no cache (the
    server's default: drafting from earlier requests' outputs too)."""
    return tuple(
        DrafterSpec.of("suffix", f"{s.arg or ''};cache={tokens}", s.dtype)
        if s.kind == "suffix" and "cache" not in s.value[1]
        else s
        for s in stages
    )


@dataclass(frozen=True)
class SuffixConfig:
    """max_match: longest context suffix searched; depth: longest drafted branch; max_rows:
    occurrences read per source; cache: tokens of earlier requests' outputs kept (0 = off)."""

    max_match: int = 24
    depth: int = 8
    max_rows: int = 256
    cache: int = 0

    def __post_init__(self) -> None:
        if min(self.max_match, self.depth, self.max_rows) < 1 or self.cache < 0:
            raise QuickdraftError(f"suffix drafter: match, depth and rows must be >= 1 and cache >= 0, got {self}")


class RecentOutputs:
    """A bounded cache of earlier requests' token streams (oldest dropped first), searched as one array."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.docs: deque[np.ndarray] = deque()
        self.size = 0
        self.text = np.zeros(0, dtype=np.int64)

    def add(self, tokens: Sequence[int]) -> None:
        doc = np.asarray(tokens, dtype=np.int64)[-self.max_tokens :]
        if self.max_tokens < 1 or not doc.size:
            return
        self.docs.append(doc)
        self.size += doc.size + 1
        while self.size > self.max_tokens and self.docs:
            self.size -= self.docs.popleft().size + 1
        sep = np.array([SEP], dtype=np.int64)
        self.text = np.concatenate([part for d in self.docs for part in (d, sep)]) if self.docs else self.text[:0]


class SuffixDrafter(Drafter):
    """Model-free trees and chains from suffix matches (module docstring).

    `tree_gain` (expected tokens per forward by budget) makes `draft_tree` auto size its trees.

    Args:
        index: the global datastore (None: the request's own text, and the cache, only).
        config: search and tree limits.
        name: the spec string, for reports.
    """

    tree_gain = TREE_GAIN
    drafts_trees = True
    drafts_ahead = True  # host lookups: a fork drafts for a guessed context (decoding/ahead.py)

    def __init__(self, index: SuffixIndex | None, config: SuffixConfig | None = None, name: str = "suffix") -> None:
        self.index, self.config, self.name = index, config or SuffixConfig(), name
        self.recent = RecentOutputs(self.config.cache)
        self.prompt_length = 0
        self.last_context: list[int] = []

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        """Start a request (ending the previous one)."""
        self.end()
        self.prompt_length = len(prompt_ids)

    def end(self) -> None:
        """The request's text (as far as it was drafted from) joins the cross-request cache when it
        is on."""
        if self.config.cache and self.last_context:
            self.recent.add(self.last_context[max(0, self.prompt_length - 32) :])
        self.last_context = []

    def fork(self) -> SuffixDrafter:
        """A drafter for one more concurrent request: the same datastore and cross-request cache,
        its own request state."""
        twin = SuffixDrafter(self.index, self.config, self.name)
        twin.recent = self.recent
        return twin

    def scored(self, context: Sequence[int], budget: int) -> tuple[dict[tuple[int, ...], float], int]:
        """({path: score} of the `budget` best continuation paths of `context`, the longest match
        length over the sources)."""
        cfg = self.config
        self.last_context = list(context)
        ids = np.asarray(context, dtype=np.int64)
        n, rows = scan_matches(ids, ids, len(ids) - 1, cfg.max_match, cfg.depth, cfg.max_rows)
        parts, longest = [trie_scores(rows, budget)], n
        if self.index is not None:
            n, lo, hi = self.index.longest_match(context, cfg.max_match)
            parts.append(trie_scores(self.index.continuations(n, lo, hi, cfg.depth, cfg.max_rows), budget))
            longest = max(longest, n)
        if self.recent.size:
            text = self.recent.text
            n, rows = scan_matches(text, ids, len(text), cfg.max_match, cfg.depth, cfg.max_rows)
            parts.append(trie_scores(rows, budget))
            longest = max(longest, n)
        return top_scores(parts, budget), longest

    def candidates(self, context: Sequence[int], budget: int) -> list[tuple[int, ...]]:
        """The `budget` best continuation paths of `context`, parents first."""
        return merge_scores([self.scored(context, budget)[0]], budget)

    def lookup_seconds(self) -> float:
        """Median seconds of a 16-node lookup after a 256-token context: a slice of the datastore (real
        matches), else a synthetic text (the request's own matches only). Measured between generations;
        the request state is kept."""
        from quickdraft.host import median_seconds

        tokens = self.index.tokens if self.index is not None and len(self.index) > 2048 else None
        context = (tokens[1024:1280] if tokens is not None else np.arange(256) % 37 + 5).tolist()
        kept = self.last_context
        seconds = median_seconds(lambda: self.candidates(context, 16), repeats=5, warmup=0)
        self.last_context = kept
        return seconds

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A tree of the `budget` best nodes (the shape's width does not apply: branching follows the
        data), or for a chain the greedy path (most frequent child at every node)."""
        if request.budget < 1:
            return TokenTree()
        if request.shape is not None:
            return paths_to_tree(self.candidates(context, request.budget))
        paths = self.candidates(context, request.budget * CHAIN_TREE_FACTOR)
        return draft_path(greedy_chain(paths, request.budget))


def build_suffix(spec: DrafterSpec, target, dtype: str = "", runtime: str = "auto") -> SuffixDrafter:
    """Suffix trees over the datastore at PATH, else the one shipped for the target (none: the
    request's own text only; `suffix:none` asks for that)."""
    path, options = spec.value
    folder = shipped_datastore(target) if path is None else (None if path == "none" else Path(path).expanduser())
    if path is None and folder is None:
        print(
            f"quickdraft: no suffix datastore ships for {target.name}: drafting from the request's own text "
            "(build one with `quickdraft build-datastore`)",
            file=sys.stderr,
        )
    index = None if folder is None else load_datastore(folder, target.vocab_size)
    return SuffixDrafter(index, SuffixConfig(**options), name=str(spec))


def _export(spec: DrafterSpec, num_draft_tokens: int, draft_dir: str | None) -> dict:
    """vLLM's SuffixDecoding: its global tree grows from the requests it serves, so our offline
    datastore has no equivalent there and is not exported."""
    options = spec.value[1]
    return {
        "method": "suffix",
        "num_speculative_tokens": num_draft_tokens,
        "suffix_decoding_max_tree_depth": options.get("depth", 8),
    }


KIND = DrafterKind(
    name="suffix",
    usage="suffix[:PATH][;cache=N][;match=M][;depth=D]",
    summary="model-free suffix-match trees over the request's text and a datastore of the target's own text",
    build=build_suffix,
    parse_arg=parse_suffix,
    has_model=False,
    drafts_trees=True,
    trained_by="build-datastore",
    asset="suffix",
    export=_export,
)
