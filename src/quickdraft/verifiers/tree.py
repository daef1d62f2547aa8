"""Verifying a token tree: the longest accepted path, lossless (SpecInfer / recursive rejection).

A `TokenTree` holds n draft nodes in parent-before-child order; node i continues the path to its
parent (-1: the root, i.e. the last committed token). The target scores the whole tree in one
forward: row 0 is p at the root, row 1 + i is p after node i.

Greedy: from the root, follow the child equal to the target's argmax; stop where none is; the next
token is the argmax there. Equal to plain greedy decoding.

Sampling (Chen et al.'s rule generalised to siblings, as in SpecInfer and recursive rejection
sampling): at a node with children x_1..x_m (in the order they were drawn), accept x_i with
probability min(1, p_i(x_i) / q_i(x_i)); after a rejection p_{i+1} = norm(max(0, p_i - q_i)). q_i
depends on how the children were drawn:
- `sampled` (without replacement from q): q_1 = q, q_{i+1} = q_i with x_i removed, renormalised;
- deterministic (prompt lookup, q None): q_i = one-hot(x_i), i.e. accept with p_i(x_i).
If every child is rejected, the next token is drawn from p_{m+1}; a node without children gives a
bonus token from its p. Each emitted token then has the target's law given the path (tested with
chi-square tests on Markov chains, with negative controls that must fail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from quickdraft.sampling import residual, sample


@dataclass
class TokenTree:
    """Draft nodes (parents before children; siblings in the order they were drawn).

    Attributes:
        tokens: (n,) token ids.
        parents: parent index per node, -1 for children of the root.
        q_rows: {parent index (-1 = root): (V,) the draft's processed distribution there} for the
            parents whose children were sampled from it; absent = deterministic children.
        scores: optional per-node draft probability of the node's whole path (for merging trees).
        shallow: (n+1, H) states after the target's first l layers of [root, nodes] of a path,
            computed while drafting (Kangaroo): verification then runs only layers [l, L).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)
    shallow: torch.Tensor | None = None

    @classmethod
    def path(
        cls, tokens: list[int], q_probs: torch.Tensor | None = None, shallow: torch.Tensor | None = None
    ) -> TokenTree:
        """A chain as a one-wide tree: node i's parent is node i - 1; q_probs (k, V) are the rows the
        chain's tokens were sampled from (None: deterministic)."""
        tree = cls(list(tokens), list(range(-1, len(tokens) - 1)), shallow=shallow)
        if q_probs is not None:
            tree.q_rows = {i - 1: q_probs[i] for i in range(len(tokens))}
        return tree

    def path_q(self) -> torch.Tensor | None:
        """(k, V) the q rows along a path (a chain's q_probs), or None when its tokens are deterministic."""
        if not self.q_rows:
            return None
        return torch.stack([self.q_rows[i - 1] for i in range(len(self.tokens))])

    def within_vocab(self, vocab_size: int) -> TokenTree:
        """The tree without its nodes whose id is outside [0, vocab_size) and their descendants (no
        target row can accept them); itself when every id is inside."""
        if all(0 <= t < vocab_size for t in self.tokens):
            return self
        index: dict[int, int] = {-1: -1}  # old node -> new node
        out = TokenTree()
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if 0 <= token < vocab_size and parent in index:
                index[i] = out.add(token, index[parent])
                if self.scores:
                    out.scores.append(self.scores[i])
        out.q_rows = {index[p]: row for p, row in self.q_rows.items() if p in index}
        if self.shallow is not None:
            out.shallow = self.shallow[[0] + [1 + i for i in sorted(index) if i >= 0]]
        return out

    def tensor(self) -> torch.Tensor:
        """(n,) int64 the node tokens."""
        return torch.tensor(self.tokens, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        return len(self.tokens) - 1

    def is_path(self) -> bool:
        """Whether it is one wide (a chain: node i's parent is node i - 1)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def children_map(self) -> dict[int, list[int]]:
        """{node (-1 = root): its children in order}."""
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        return kids

    @property
    def depths(self) -> list[int]:
        """1 for children of the root, and so on."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def mask(self) -> torch.Tensor:
        """(n+1, n+1) bool attention mask over [root, nodes]: each row sees the root and its ancestors."""
        n = len(self.tokens)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        for i, p in enumerate(self.parents):
            m[i + 1, i + 1] = True
            if p >= 0:
                m[i + 1] |= m[p + 1]
        return m

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.insert(0, node)
            node = self.parents[node]
        return path


def follow_greedy(tree: TokenTree, best: list[int]) -> tuple[list[int], int]:
    """(accepted node path, next token) given the target's argmax at the root and after each node
    ((n+1,) ids: read from the device once per round, for every row of a batch at once)."""
    kids = tree.children_map()
    node, path = -1, []
    while True:
        want = best[node + 1]
        nxt = next((c for c in kids.get(node, []) if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def acceptance_ratio(p: torch.Tensor, q: torch.Tensor | None, x: int) -> float:
    """p(x) / q(x) in p's dtype, read once (q None: a deterministic draft, q(x) = 1). p, q: (V,)."""
    if q is None:
        return p[x].item()
    if p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64):  # numpy's scalars divide in the
        # rows' dtype as torch does (IEEE, correctly rounded), without torch's dispatch
        p_x, q_x = p.numpy()[x], q.numpy()[x]
        return float(p_x / max(q_x, q_x.dtype.type(torch.finfo(p.dtype).tiny)))
    return (p[x] / q[x].clamp_min(torch.finfo(p.dtype).tiny)).item()


def verify_tree_sampling(
    tree: TokenTree, p_rows: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """(accepted node path, next token) by recursive rejection over siblings (module docstring).

    One uniform per node is drawn up front in node order (so a one-wide tree consumes the random
    stream exactly as chain speculative sampling does), then one sample for the next token.

    Args:
        tree: the drafted tree with its q rows.
        p_rows: (n+1, V) processed target probabilities.
    """
    u = torch.rand(len(tree), generator=generator, dtype=p_rows.dtype, device=p_rows.device).tolist()
    kids = tree.children_map()
    node, path = -1, []
    while True:
        p = p_rows[node + 1]
        q_parent = tree.q_rows.get(node)
        q = None if q_parent is None else q_parent.to(p.dtype)
        accepted, rejected_any = None, False
        for c in kids.get(node, []):
            x = tree.tokens[c]
            if u[c] < acceptance_ratio(p, q, x):  # strict: a token with p = 0 is never accepted
                accepted = c
                break
            q_i = q
            if q is None:  # a deterministic draft's q: one-hot at x
                q_i = torch.zeros_like(p)
                q_i[x] = 1.0
            p, rejected_any = residual(p, q_i), True
            if q is not None:  # drawn without replacement: the next sibling came from q minus x
                q = q.clone()
                q[x] = 0.0
                q = q / q.sum().clamp_min(torch.finfo(p.dtype).tiny)
        if accepted is None:  # the bonus goes through residual(p, 0) as in the chain rule
            return path, int(sample(p if rejected_any else residual(p, torch.zeros_like(p)), generator))
        path.append(accepted)
        node = accepted
