"""The suffix drafter's index: a suffix array over the *reversed* token stream of a datastore.

The drafter asks, every round, for the longest suffix of the context that occurs in the datastore
and for what followed its occurrences. Over the reversed text, the context's suffix read backwards
(x_t, x_{t-1}, ...) is a prefix of the suffixes it matches, so one more token of match narrows the
current suffix-array range by two bisections on one column: the longest match of up to `max_match`
tokens costs O(max_match log N) scalar reads, with no pattern copies.

Chosen by measurement over the alternatives (docs/benchmarks.md, "Suffix drafting"): a suffix
automaton or suffix tree in Python objects takes ~1 GB and tens of seconds for 6M tokens; this
index is two flat arrays (tokens and int32 positions, 4 + 2 bytes a token) that memory-map in
milliseconds, built once by prefix doubling with numpy's argsort.

Layout: `tokens` (N,) int32, documents separated by SEP (-1); `order` (N,) int32, the suffix array
of tokens[::-1] sorted by their first `SORTED_DEPTH` tokens (ties by position), so matches are
exact up to that many tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

SEP = -1  # between documents: never matched, never drafted
SORTED_DEPTH = 32  # suffixes are sorted by this many leading tokens (prefix doubling, 5 rounds)


def concat_documents(docs: Iterable[Sequence[int]]) -> np.ndarray:
    """(N,) int32: the documents joined with SEP after each."""
    parts = []
    for doc in docs:
        if len(doc):
            parts.append(np.asarray(doc, dtype=np.int32))
            parts.append(np.array([SEP], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def reversed_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """(N,) int32 start positions in tokens[::-1] of its suffixes, sorted by their first SORTED_DEPTH
    tokens (a position past the end sorts before every token; ties keep position order)."""
    text = tokens[::-1].astype(np.int64)
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank = text - text.min() + 1  # >= 1; 0 stands for "past the end"
    step = 1
    while step < SORTED_DEPTH:
        following = np.zeros(n, dtype=np.int64)
        following[:-step] = rank[step:]
        key = rank * (int(rank.max()) + 1) + following
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        fresh = np.empty(n, dtype=np.int64)
        fresh[order] = np.concatenate([[1], 1 + np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        rank = fresh
        step *= 2
    return np.argsort(rank, kind="stable").astype(np.int32)


class _Column:
    """order[lo:hi] viewed as the tokens at depth `depth` of each reversed suffix (for bisect)."""

    __slots__ = ("rev", "order", "depth")

    def __init__(self, rev: np.ndarray, order: np.ndarray, depth: int) -> None:
        self.rev, self.order, self.depth = rev, order, depth

    def __getitem__(self, i: int) -> int:
        return int(self.rev[self.order[i] + self.depth])

    def __len__(self) -> int:
        return len(self.order)


class SuffixIndex:
    """Longest-match queries and continuations over one datastore (read-only after construction).

    Args:
        tokens: (N,) int32 documents joined by SEP.
        order: its `reversed_suffix_array` (computed when None).
    """

    def __init__(self, tokens: np.ndarray, order: np.ndarray | None = None) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.order = reversed_suffix_array(self.tokens) if order is None else np.asarray(order)
        if len(self.order) != len(self.tokens):
            raise ValueError(f"a suffix array of {len(self.order)} rows for {len(self.tokens)} tokens")
        # reversed text padded with SORTED_DEPTH "past the end" markers (-2, below every token)
        self.rev = np.concatenate([self.tokens[::-1], np.full(SORTED_DEPTH, -2, dtype=np.int32)])

    def __len__(self) -> int:
        return len(self.tokens)

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[int, int, int]:
        """(n, lo, hi): the longest suffix of `context` (n <= min(max_match, SORTED_DEPTH) tokens)
        occurring in the datastore, and the range order[lo:hi] of its occurrences; n = 0 if none."""
        lo, hi, n = 0, len(self.order), 0
        for depth in range(min(max_match, SORTED_DEPTH, len(context))):
            token = int(context[-1 - depth])
            column = _Column(self.rev, self.order, depth)
            a = bisect.bisect_left(column, token, lo, hi)
            b = bisect.bisect_right(column, token, a, hi)
            if a == b:
                break
            lo, hi, n = a, b, depth + 1
        return (n, lo, hi) if n else (0, 0, 0)

    def continuations(self, n: int, lo: int, hi: int, depth: int, max_rows: int) -> np.ndarray:
        """(m, depth) int64: the `depth` tokens after each of at most `max_rows` occurrences of a
        match (evenly spaced over the range when there are more), -1 after a document ends."""
        if n == 0 or hi <= lo:
            return np.zeros((0, depth), dtype=np.int64)
        picks = np.arange(lo, hi) if hi - lo <= max_rows else np.linspace(lo, hi - 1, max_rows).astype(np.int64)
        starts = len(self.tokens) - self.order[picks].astype(np.int64)  # first token after the match
        idx = starts[:, None] + np.arange(depth)[None, :]
        rows = np.where(idx < len(self.tokens), self.tokens[np.minimum(idx, len(self.tokens) - 1)], SEP)
        rows = rows.astype(np.int64)
        ended = np.cumsum(rows < 0, axis=1) > 0  # everything after a separator is cut
        rows[ended] = -1
        return rows
