"""The suffix drafter's pure parts: matches of a context's suffix in a text, the frequency trie of
what followed them, and the best paths of several tries as a tree or a chain (`suffix.py` reads them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quickdraft.drafters.model_free.suffix_index import SEP
from quickdraft.verifiers.tree import TokenTree


def scan_matches(text: np.ndarray, context: Sequence[int], limit: int, max_match: int, depth: int, max_rows: int):
    """(n, rows): the longest suffix of `context` (n <= max_match tokens) ending at a position < `limit`
    of `text`, and the (m, depth) int64 tokens after its most recent `max_rows` occurrences (-1 after
    a separator or the end of `text`); n = 0 and no rows when nothing matches."""
    t = len(context)
    empty = np.zeros((0, depth), dtype=np.int64)
    if t == 0 or limit <= 0:
        return 0, empty
    pattern = np.asarray(context[-min(t, max_match) :], dtype=np.int64)
    hits = np.flatnonzero(text[:limit] == pattern[-1])
    if not hits.size:
        return 0, empty
    n = 1
    while n < len(pattern):
        longer = hits[hits >= n]
        longer = longer[text[longer - n] == pattern[-1 - n]]
        if not longer.size:
            break
        hits, n = longer, n + 1
    hits = hits[-max_rows:]
    idx = hits[:, None] + 1 + np.arange(depth)[None, :]
    rows = np.where(idx < len(text), text[np.minimum(idx, len(text) - 1)], SEP).astype(np.int64)
    rows[np.cumsum(rows < 0, axis=1) > 0] = -1
    return n, rows


def trie_scores(rows: np.ndarray, budget: int) -> dict[tuple[int, ...], float]:
    """The `budget` best prefixes of `rows` (m, depth) by count / m, as {path: score}; ties go to the
    shorter path, then to the smaller path, so the result is prefix-closed.

    One sort for every depth: with the rows in order, a prefix of length d starts a new group at row i
    when row i shares fewer than d leading tokens with row i - 1, and its count is the distance to the
    next such row. A prefix holding a -1 (nothing followed) is not a path.
    """
    m, depth = rows.shape
    if m == 0 or budget < 1:
        return {}
    ranked = rows[np.lexsort(rows.T[::-1])]  # rows in order as tuples, the first column most significant
    shared = np.full(m, -1, dtype=np.int64)  # leading tokens equal to the row before (-1: the first row)
    if m > 1:
        shared[1:] = np.cumprod(ranked[1:] == ranked[:-1], axis=1).sum(axis=1)
    opens = np.flatnonzero(shared[None, :] < np.arange(1, depth + 1)[:, None])  # (depth, m) flattened, d-major
    counts = np.diff(np.append(opens, depth * m))  # row 0 opens every depth: each depth's last group ends there
    dep, first = opens // m + 1, opens % m
    keep = ranked[first, dep - 1] >= 0
    score, dep, first = counts[keep] / m, dep[keep], first[keep]
    best = np.lexsort((dep, -score))[:budget]
    return {tuple(ranked[first[i], : dep[i]].tolist()): float(score[i]) for i in best}


def top_scores(parts: Sequence[dict[tuple[int, ...], float]], budget: int) -> dict[tuple[int, ...], float]:
    """The `budget` best paths over several sources, each with its best score (ties: shorter first)."""
    best: dict[tuple[int, ...], float] = {}
    for part in parts:
        for path, score in part.items():
            if score > best.get(path, -1.0):
                best[path] = score
    ranked = sorted(best, key=lambda path: (-best[path], len(path), path))[:budget]
    return {path: best[path] for path in ranked}


def merge_scores(parts: Sequence[dict[tuple[int, ...], float]], budget: int) -> list[tuple[int, ...]]:
    """The `budget` best paths over several sources (best score per path), parents first."""
    best = top_scores(parts, budget)
    return sorted(best, key=lambda path: (len(path), -best[path], path))


def greedy_chain(paths: Sequence[tuple[int, ...]], length: int) -> list[int]:
    """Up to `length` tokens of the greedy path through parent-first `paths` (sorted by score within
    a depth): the best child at every node."""
    chosen: tuple[int, ...] = ()
    for path in paths:
        if len(path) == len(chosen) + 1 and path[:-1] == chosen:
            chosen = path
    return list(chosen[:length])


def paths_to_tree(paths: Sequence[tuple[int, ...]]) -> TokenTree:
    """A TokenTree from prefix-closed paths sorted parents first (deterministic: no q rows)."""
    tree, node = TokenTree(), {}
    for path in paths:
        node[path] = tree.add(path[-1], node[path[:-1]] if len(path) > 1 else -1)
    return tree
