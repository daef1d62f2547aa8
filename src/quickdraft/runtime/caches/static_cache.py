"""`KVCache`: the one position-indexed cache of the native forward, one sequence's.

(layers, kv_heads, capacity, head_dim) keys and values, grown by doubling (rarely: the capacity starts
at the expected length), `length` valid positions; rollback sets a length (nothing is copied) and
`keep` moves a chosen subset of new rows into place (the accepted path of a tree).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Preallocated keys and values for `layers` blocks: (layers, kv_heads, capacity, head_dim) each.

    Args:
        capacity: positions allocated up front (grown by doubling when a write needs more).
        limit: the most positions it may ever hold (the model's context).
    """

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype, device, capacity: int = 512, limit: int = 1 << 30
    ) -> None:
        self.limit = limit
        shape = (layers, kv_heads, min(capacity, limit), head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @classmethod
    def over(cls, k: torch.Tensor, v: torch.Tensor, length: int) -> KVCache:
        """A cache over given (layers, kv_heads, capacity, head_dim) keys and values holding `length`
        positions: views into another owner's tensors (a batch cache's row, `BatchKVCache.row`), which
        stays their one owner (it grows them; a forward through this writes into them)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.length, cache.limit = k, v, length, k.shape[2]
        return cache

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def ensure(self, length: int) -> None:
        """Room for `length` positions."""
        if length > self.capacity:
            new = grown_capacity(length, self.capacity, self.limit)
            self.k, self.v = grow(self.k, 2, new), grow(self.v, 2, new)

    def rollback(self, length: int) -> None:
        """Keep positions [0, length): a new length, nothing copied."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        self.length = length

    def keep(self, rows: torch.Tensor, dst: int, layers: slice = slice(None)) -> None:
        """Copy positions `rows` (m,) to dst..dst+m (all layers, or `layers`) and end the cache there:
        keep a chosen subset of new rows."""
        for t in (self.k, self.v):
            t[layers, :, dst : dst + rows.numel()] = t[layers, :, rows]
        self.length = dst + rows.numel()

    def attend(
        self, layer: int, at: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Store (kv_heads, T, d) keys and values at at..at+T of `layer`, then attend (heads, T, d)
        queries over [0, at + T) under `mask` ((T, at + T) bool, None: everything): (heads, T, d)."""
        keys, values = self.write(layer, at, k, v)
        if keys.dtype != q.dtype:  # a cache kept in another dtype than the activations
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]

    def write(self, layer: int, at: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (kv_heads, n, head_dim) keys and values at positions at..at+n of `layer`; returns the
        layer's keys and values over [0, at + n) in the cache's dtype."""
        n = k.shape[1]
        self.k[layer, :, at : at + n] = k
        self.v[layer, :, at : at + n] = v
        return self.k[layer, :, : at + n], self.v[layer, :, : at + n]


def grown_capacity(length: int, capacity: int, limit: int) -> int:
    """The capacity a cache grows to for `length` positions: doubled (at least `length`, at most
    `limit`); more than `limit` is an error."""
    if length > limit:
        raise ValueError(f"KV cache of {length} positions exceeds the model's context of {limit}")
    return min(limit, max(length, 2 * capacity))


def grow(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """`t` with dimension `dim` grown to `size` (zeros after the old entries): one copy."""
    shape = list(t.shape)
    shape[dim] = size
    grown = t.new_zeros(shape)
    grown.narrow(dim, 0, t.shape[dim]).copy_(t)
    return grown
