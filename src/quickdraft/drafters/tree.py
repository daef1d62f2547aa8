"""Drafting token trees: several continuations per round, verified together
(`SpeculativeDecoder.tree`, decoding/vanilla.py).

Model drafters grow the tree level by level, one draft forward per level over all of that level's
new nodes (a tree attention mask, positions by depth; the native runtime). Two shapes:
- dynamic (EAGLE-2): at each depth the `width` most probable nodes (cumulative draft probability of
  their path) are expanded into `width` children each, and the most probable children join the tree
  until the node budget is spent;
- static: `widths[d]` children for every node of depth d (the top-k-per-depth shape).
Greedy drafting takes the top children and keeps the most probable paths. Sampling first fixes how
many children each expanded node gets (its most probable parents first), then draws exactly that
many without replacement from q and keeps them all: a count chosen after seeing the children would
bias them, and the sibling rejection rule would no longer be lossless (a test caught exactly that).
Prompt lookup contributes the continuations of several earlier matches, merged into a trie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import greedy, logits_to_probs, sample
from quickdraft.verifiers.tree import TokenTree


@dataclass(frozen=True)
class TreeShape:
    """A tree's node budget and shape: dynamic with `width`, or static with per-depth `widths`."""

    budget: int
    width: int = 4
    widths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.budget < 1 or self.width < 1 or (self.widths is not None and min(self.widths, default=0) < 1):
            raise QuickdraftError(f"a draft tree needs a budget, width and widths >= 1, got {self}")

    def children_at(self, depth: int) -> int:
        """Children per expanded node at this depth (1-based)."""
        if self.widths is None:
            return self.width
        return self.widths[depth - 1] if depth <= len(self.widths) else 0


def _draw_children(logits: torch.Tensor, k: int, sampling: SamplingConfig, generator) -> tuple[list, torch.Tensor]:
    """k children of one node, sampled without replacement, in drawn order, and the q they come
    from: (tokens, (V,) q). (Greedy trees rank children with `_best_children`.)"""
    q = logits_to_probs(logits, sampling)
    left, tokens = q, []
    for _ in range(k):
        if float(left.sum()) <= 0:
            break
        x = int(sample(left, generator))
        tokens.append(x)
        left = left.clone()
        left[x] = 0.0
        left = left / left.sum() if float(left.sum()) > 0 else left
    return tokens, q


def model_tree(model, context: Sequence[int], shape: TreeShape, sampling: SamplingConfig, generator) -> TokenTree:
    """Grow a tree with a draft model on the native runtime (its cache ends as it began: `context`).

    Args:
        model: a NativeCachedModel (tree masks need the native runtime).
        context: the committed ids (the root is its last token).
    """
    if not model.supports_trees:
        raise QuickdraftError("tree drafting needs the native runtime for the draft model (--runtime auto|native)")
    base = len(context)

    def expand(tree: TokenTree, new: list[int]) -> torch.Tensor:
        full = tree.mask()[1:, 1:]  # (n, n) among nodes
        mask = torch.cat([torch.ones(len(new), base, dtype=torch.bool), full[torch.tensor(new)]], dim=1)
        positions = [base - 1 + tree.depths[i] for i in new]
        return model.extend([tree.tokens[i] for i in new], positions=positions, tree_mask=mask)  # (m, V)

    tree = grow_tree(model.sync(context)[-1], expand, shape, sampling, generator)
    model.rollback(base)  # drop the tree rows: the next round syncs to what was accepted
    return tree


def grow_tree(root_logits: torch.Tensor, expand, shape: TreeShape, sampling: SamplingConfig, generator) -> TokenTree:
    """Grow a tree level by level from the root's (V,) draft logits.

    Args:
        expand: (tree, new node ids) -> (m, V) draft logits of each new node's children, one
            draft forward over the level (the caller's model and its masks).
    """
    tree = TokenTree()
    cum: list[float] = []
    frontier: list[tuple[int, torch.Tensor]] = [(-1, root_logits)]
    depth = 0
    while frontier and len(tree) < shape.budget:
        depth += 1
        k = shape.children_at(depth)
        if k == 0:
            break
        room = shape.budget - len(tree)
        limit = room if shape.widths is not None else min(room, shape.width)
        if sampling.greedy:
            new = _add_best_children(tree, cum, frontier, k, limit, sampling, generator)
        else:
            new = _add_sampled_children(tree, cum, frontier, k, limit, sampling, generator)
        if not new or len(tree) >= shape.budget:
            break
        logits = expand(tree, new)
        order = sorted(range(len(new)), key=lambda j: -cum[new[j]])
        keep = order if shape.widths is not None else order[: shape.width]
        frontier = [(new[j], logits[j]) for j in sorted(keep)]
    tree.scores = [math.exp(c) for c in cum[: len(tree)]]  # path probabilities under the draft
    return tree


def _score(cum: list[float], parent: int, q: torch.Tensor, token: int) -> float:
    return (0.0 if parent < 0 else cum[parent]) + float(torch.log(q[token].clamp_min(1e-30)))


def _best_children(frontier: list[tuple[int, torch.Tensor]], k: int) -> list[list[tuple[int, float]]]:
    """Each frontier node's k most probable children (one: the argmax, the first of equal maxima) and
    their log q, the frontier's (m, V) draft logits ranked together and read from the device once (a
    level's one sync on a GPU, where a read a child cost one each)."""
    logits = torch.stack([row for _, row in frontier]).float()  # (m, V)
    q = torch.softmax(logits, -1)
    idx = greedy(logits)[:, None] if k == 1 else torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    logq = torch.log(q.gather(-1, idx).clamp_min(1e-30))  # (m, k) as float32, as each child's own read
    both = torch.cat([idx.double(), logq.double()], dim=-1).tolist()  # ids < 2^53: exact in float64
    n = idx.shape[1]
    return [list(zip((int(t) for t in row[:n]), row[n:], strict=True)) for row in both]


def _add_best_children(tree, cum, frontier, k, limit, sampling, generator) -> list[int]:
    """Greedy: the top-k children of every frontier node compete; the `limit` most probable paths
    join (deterministic drafts: any shape keeps greedy verification exact)."""
    queues = [
        [((0.0 if node < 0 else cum[node]) + logq, t, node) for t, logq in children]
        for (node, _), children in zip(frontier, _best_children(frontier, k), strict=True)
    ]
    new: list[int] = []
    while len(new) < limit and any(queues):
        best = max((qu for qu in queues if qu), key=lambda qu: qu[0][0])
        score, token, parent = best.pop(0)
        new.append(tree.add(token, parent))
        cum.append(score)
    return new


def _add_sampled_children(tree, cum, frontier, k, limit, sampling, generator) -> list[int]:
    """Sampling: how many children each frontier node gets is fixed before they are drawn (the most
    probable parents first), then exactly that many are drawn without replacement and all kept. A
    count chosen after seeing the children's values would bias them and break the sibling rule."""
    order = sorted(frontier, key=lambda item: -(0.0 if item[0] < 0 else cum[item[0]]))
    new: list[int] = []
    for node, logits in order:
        count = min(k, limit - len(new))
        if count <= 0:
            break
        tokens, q = _draw_children(logits, count, sampling, generator)
        tree.q_rows[node] = q
        for t in tokens:
            new.append(tree.add(t, node))
            cum.append(_score(cum, node, q, t))
    return new


def lookup_tree(context: Sequence[int], shape: TreeShape, max_ngram: int = 3, min_ngram: int = 1) -> TokenTree:
    """A trie of the continuations that followed earlier occurrences of the context's suffix n-grams
    (longest n first, most recent match first), at most `shape.width` of them, within the budget."""
    ids = np.asarray(context, dtype=np.int64)
    total, tree, seen = len(ids), TokenTree(), set()
    conts: list[list[int]] = []
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        windows = sliding_window_view(ids[: total - 1], n)
        for hit in np.flatnonzero((windows == ids[total - n :]).all(axis=1))[::-1]:
            cont = ids[hit + n : hit + n + shape.budget].tolist()
            if cont and tuple(cont) not in seen:
                seen.add(tuple(cont))
                conts.append(cont)
            if len(conts) >= shape.width:
                break
        if len(conts) >= shape.width:
            break
    for cont in conts:
        node = -1
        for token in cont:
            child = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
            if child is None:
                if len(tree) >= shape.budget:
                    break
                child = tree.add(token, node)
            node = child
    return _parent_first(tree)


def _parent_first(tree: TokenTree) -> TokenTree:
    """The same tree renumbered so that parents come before children and depth increases."""
    order = sorted(range(len(tree)), key=lambda i: (tree.depths[i], i))
    index = {old: new for new, old in enumerate(order)}
    out = TokenTree()
    for old in order:
        out.add(tree.tokens[old], -1 if tree.parents[old] < 0 else index[tree.parents[old]])
    return out
