"""The next round's draft, made while this round's verify runs (issue #70 item 2).

On a GPU the verify is one graph replay that runs while the host waits for its verdict, beside host
work a round of the same order that, done after the verdict, did not overlap it (docs/gpu.md has the
profile). Where a drafter `drafts_ahead` (the suffix and prompt-lookup drafters:
host lookups that depend on the context only), a fork of it (the lane's drafter is left untouched)
drafts the next round there, for the outcomes that commit most: a whole branch of the draft accepted, for its first
`GUESSES` leaves (the first path's leaf first: drafters rank the better sibling first). Only those
can be guessed: where a node is rejected, the target's token is one the draft did not hold. Each
asks one node more than this round's budget, so the guessed branch's continuation starts with the
candidates for the bonus token the target will pick.

Next round, `take_ahead` keeps the draft whose guess held: the committed context is the guessed one
plus one bonus token, and the draft has that token among its first nodes; the subtree below it,
cut to the next request's budget, is the round's draft (a chain request takes its first path). Any
other outcome drafts as usual. Either way the draft is only a proposal the target verifies, so the
outputs are unchanged (greedy: equal tokens; sampled: the target's law) and only where the host
spends its time moves. Off by default; the batched decoder turns it on over captured graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from quickdraft.drafters.base import DraftRequest
from quickdraft.verifiers.tree import TokenTree

GUESSES = 3  # the branches drafted ahead (each a host lookup, while the verify runs)


@dataclass
class Ahead:
    """A draft made for a guessed outcome of the round in flight.

    Attributes:
        context: the committed ids it was drafted for: the lane's context and the guessed path.
        draft: its draft, one node deeper than the round's budget (first nodes: the bonus's candidates).
    """

    context: list[int]
    draft: TokenTree


def deeper(request: DraftRequest) -> DraftRequest:
    """`request` with one node more (a tree's shape included)."""
    shape = None if request.shape is None else replace(request.shape, budget=request.budget + 1)
    return replace(request, budget=request.budget + 1, shape=shape)


def first_path(draft: TokenTree) -> list[int]:
    """The draft's node indices from the root along each node's first child: a chain's whole
    length, a tree's best-ranked branch (drafters list the better sibling first)."""
    path, parent = [], -1
    for i, p in enumerate(draft.parents):
        if p == parent:
            path.append(i)
            parent = i
    return path


def branches(draft: TokenTree, most: int = GUESSES) -> list[list[int]]:
    """The node paths from the root to the draft's first `most` leaves (the first path's leaf, then
    the others in node order)."""
    inner = set(draft.parents)
    first = first_path(draft)
    leaves = [first[-1]] if first else []
    leaves += [i for i in range(len(draft)) if i not in inner and i not in leaves]
    paths = []
    for leaf in leaves[:most]:
        path = [leaf]
        while draft.parents[path[-1]] != -1:
            path.append(draft.parents[path[-1]])
        paths.append(path[::-1])
    return paths


def guess(context: Sequence[int], draft: TokenTree, path: list[int] | None = None) -> list[int]:
    """The committed ids if every node of `path` (default: the first path) is accepted (the bonus
    token not yet known)."""
    return [*context, *(draft.tokens[i] for i in (first_path(draft) if path is None else path))]


def subtree(draft: TokenTree, token: int, request: DraftRequest) -> TokenTree | None:
    """The nodes below the root child `token` of `draft` as a draft of their own (that child is the
    new root), parents before children, cut to `request.budget` nodes; a chain request takes the
    first path only. None when no root child is `token` or nothing is below it."""
    top = next(
        (i for i, (t, p) in enumerate(zip(draft.tokens, draft.parents, strict=True)) if p == -1 and t == token), None
    )
    if top is None:
        return None
    index = {top: -1}  # old node -> new node (the new root: -1)
    out = TokenTree()
    for i in range(top + 1, len(draft)):
        p = draft.parents[i]
        if p in index and len(out) < request.budget:
            if request.shape is None and any(q == index[p] for q in out.parents):
                continue  # a chain: the first child of each node only
            index[i] = out.add(draft.tokens[i], index[p])
            if draft.scores:
                out.scores.append(draft.scores[i])
    return out if len(out) else None


def take_ahead(ahead: Sequence[Ahead], context: Sequence[int], request: DraftRequest | None) -> TokenTree | None:
    """The draft made ahead whose guess held: `context` is its guessed one plus one bonus token found
    among its draft's first nodes. None: nothing drafted ahead, a plain round, or every guess missed."""
    if request is None or request.budget < 1:
        return None
    for made in ahead:
        n = len(made.context)
        if len(context) == n + 1 and list(context[:n]) == made.context:
            return subtree(made.draft, context[-1], request)
    return None
