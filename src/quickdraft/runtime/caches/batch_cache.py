"""BatchKVCache: the keys and values of many sequences decoded together, each with its own length.

Rows are the running sequences, always packed at [0, rows) so a batched forward reads a view (no
gather): a sequence joins by copying its prefilled single-sequence cache (`adopt`) into the next
row, and leaves by moving the last row into its place (`remove`, compaction). Each row has its own
length; a batched forward writes row b's new keys at lengths[b].. and attends under a mask that
hides everything past a row's own positions (stale keys of rejected drafts, other rows' padding).
After verification each row keeps its accepted positions (`commit`: rollback and tree compaction
in one copy of at most the round's width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quickdraft.runtime.caches.static_cache import KVCache, grow, grown_capacity


class BatchKVCache:
    """(layers, max_batch, kv_heads, capacity, head_dim) keys and values and one length per row.

    Args:
        max_batch: rows allocated up front.
        capacity: positions per row allocated up front (grown by doubling).
        limit: the most positions a row may hold (the model's context).
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype,
        device,
        max_batch: int,
        capacity: int = 256,
        limit: int = 1 << 30,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        shape = (layers, max_batch, kv_heads, min(capacity, limit), head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.limit, self.max_batch = limit, max_batch
        self.lengths: list[int] = []  # committed positions of each running row
        self.starts = torch.zeros(0, dtype=torch.long)  # (B,) where the current forward writes
        self.span = 0  # positions the current forward's attention reads
        self.groups: list[tuple[list[int], int]] | None = None  # (rows, span) groups of that forward
        self.index: tuple | None = None  # the current forward's write index, made by its first layer

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def row(self, row: int) -> KVCache:
        """Row `row`'s keys and values as a one-sequence cache (views: this cache stays their owner)."""
        return KVCache.over(self.k[:, row], self.v[:, row], self.lengths[row])

    def ensure(self, length: int) -> None:
        """Room for `length` positions in every row."""
        if length > self.capacity:
            new = grown_capacity(length, self.capacity, self.limit)
            self.k, self.v = grow(self.k, 3, new), grow(self.v, 3, new)

    def adopt(self, cache: KVCache) -> int:
        """Copy a single sequence's cache (its `length` positions) into a new row; returns the row."""
        if self.rows >= self.max_batch:
            raise ValueError(f"the batch is full ({self.max_batch} rows)")
        row, n = self.rows, cache.length
        self.ensure(n)
        self.k[:, row, :, :n] = cache.k[:, :, :n]
        self.v[:, row, :, :n] = cache.v[:, :, :n]
        self.lengths.append(n)
        return row

    def remove(self, row: int) -> None:
        """Drop a row; the last row moves into its place (its index becomes `row`)."""
        if not 0 <= row < self.rows:
            raise ValueError(f"no row {row} (rows: {self.rows})")
        last = self.rows - 1
        if row != last:
            n = self.lengths[last]
            self.k[:, row, :, :n] = self.k[:, last, :, :n]
            self.v[:, row, :, :n] = self.v[:, last, :, :n]
            self.lengths[row] = n
        self.lengths.pop()

    def begin(self, width: int) -> torch.Tensor:
        """Prepare a forward of `width` new positions per row (padded): returns the (B,) starts and
        sets the span its attention reads (the longest row's length + width) and the row groups
        that read less (`length_groups`)."""
        self.span = max(self.lengths) + width
        self.ensure(self.span)
        self.starts = torch.tensor(self.lengths, dtype=torch.long, device=self.k.device)
        self.groups = length_groups([n + width for n in self.lengths])
        return self.starts

    def attend(
        self, layer: int, at: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Store each row's (B, kv_heads, T, d) keys and values (`write`), then attend its (B, heads,
        T, d) queries under `mask` ((B, 1, T, span)): the whole span at once, or, when rows differ
        much in length, each group of rows over its own span only (what lies beyond a row's own
        positions is masked either way): (B, heads, T, d)."""
        keys, values = self.write(layer, at, k, v)
        if keys.dtype != q.dtype:
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        if mask.dtype not in (torch.bool, q.dtype):  # an additive mask (a GPU's: native.forward_batch)
            mask = mask.to(q.dtype)
        if self.groups is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        out = torch.empty_like(q)
        for rows, span in self.groups:
            idx = torch.tensor(rows, device=q.device)
            out[idx] = F.scaled_dot_product_attention(
                q[idx], keys[idx, :, :span], values[idx, :, :span], attn_mask=mask[idx, :, :, :span], enable_gqa=True
            )
        return out

    def write(
        self, layer: int, at: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, kv_heads, T, head_dim) keys and values at positions at[b]..at[b]+T of each row;
        returns the layer's (B, kv_heads, span, head_dim) keys and values (views). The index is made
        once a forward (its first layer's call; the forward clears `index` first): on a GPU each layer's
        own would be three more kernels."""
        b, t = k.shape[0], k.shape[2]
        if self.index is None or self.index[0] is not at or self.index[1] != (b, t):
            pos = at[:, None] + torch.arange(t, device=at.device)  # (B, T)
            self.index = (at, (b, t), torch.arange(b, device=at.device)[:, None], pos)
        rows, pos = self.index[2], self.index[3]
        self.k[layer][rows, :, pos] = k.transpose(1, 2)  # indexed as (B, T, kv_heads, d)
        self.v[layer][rows, :, pos] = v.transpose(1, 2)
        return self.k[layer, :b, :, : self.span], self.v[layer, :b, :, : self.span]

    def commit(self, row: int, keep: torch.Tensor) -> None:
        """Keep positions lengths[row] + keep (m,) (offsets into the last forward's new positions,
        increasing) as that row's next m positions: a chain's accepted prefix or a tree's path."""
        start = self.lengths[row]
        if bool((keep == torch.arange(keep.numel())).all()):  # a prefix: already in place
            self.lengths[row] = start + keep.numel()
            return
        src = start + keep.to(self.k.device, non_blocking=True)
        for t in (self.k, self.v):
            r = t[:, row]  # a view: (layers, kv_heads, capacity, d)
            r[:, :, start : start + keep.numel()] = r[:, :, src]
        self.lengths[row] = start + keep.numel()


def length_groups(spans: list[int], saving: float = 0.6) -> list[tuple[list[int], int]] | None:
    """Rows split in two by the positions they read (`spans`, the rows' lengths + the width): the
    split (shorter rows | longer rows) that reads the fewest positions, when it reads at most
    `saving` of what every row reading the longest span does; else None (one attention call)."""
    order = sorted(range(len(spans)), key=spans.__getitem__)
    whole = len(spans) * spans[order[-1]]
    best, cut = whole, None
    for i in range(1, len(order)):
        cost = i * spans[order[i - 1]] + (len(order) - i) * spans[order[-1]]
        if cost < best:
            best, cut = cost, i
    if cut is None or best > saving * whole:
        return None
    return [(sorted(order[:cut]), spans[order[cut - 1]]), (sorted(order[cut:]), spans[order[-1]])]
