"""BatchedTarget: the one owner of the target's batch cache, for sequences decoded together.

A joining sequence is prefilled alone, in chunks, in the single-sequence owner's cache (so a long
prompt never stalls the running rows for more than one chunk per round) and then copied into the
next row (`adopt`). Every round, one batched forward runs each row's block (the last committed
token, then the row's draft nodes, padded to a common width) against that row's own context;
`commit` keeps each row's accepted positions, `remove` drops a finished row (the last row moves
into its place, so callers keep their per-row records in the same order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.batch_cache import BatchKVCache
from quickdraft.runtime.caches.kv_cache import kv_bytes_per_token
from quickdraft.runtime.caches.prefix_store import PrefixStore, default_budget, reusable
from quickdraft.runtime.kernels import attention
from quickdraft.types import TargetOutput


@dataclass
class RowBlock:
    """One row's new tokens in a batched forward.

    Attributes:
        tokens: (n,) ids: the last committed token, then the draft nodes.
        depths: (n,) position offsets from the row's length (None: 0..n-1, a chain).
        mask: (n, n) bool, which new rows each new row sees (None: causal).
        shallow: (n, H) a chain's states after the target's first l layers (Kangaroo), computed
            while drafting: a lone sequence's forward runs only the remaining layers (a batch
            computes every row in full).
    """

    tokens: list[int]
    depths: list[int] | None = None
    mask: torch.Tensor | None = None
    shallow: torch.Tensor | None = None


class BatchedTarget:
    """The target's batched forward over `max_batch` rows, and the single-sequence owner that
    prefills joining sequences.

    Args:
        single: the target (`runtime/target.Target`) whose `supports_batches` is true: its `net` is the
            batched forward (`forward_batch`, its shapes and device), it owns the weights, LM head
            and prefill cache.
        max_batch: the most rows decoded together.
        store_bytes: the bound of the finished rows' kept prefixes (`prefix_store.py`; None: its default).
    """

    def __init__(self, single, max_batch: int, store_bytes: int | None = None) -> None:
        if not single.supports_batches:  # declared on the protocol, never probed by class
            raise TypeError(f"batched decoding needs a target that supports batches (not the {single.runtime} runtime)")
        net = single.net
        self.single, self.net, self.vocab_size = single, net, single.vocab_size
        self.cache = BatchKVCache(
            net.num_layers, net.kv_heads, net.head_dim, net.dtype, net.device, max_batch, limit=net.max_length
        )
        self.num_forwards = 0
        self.keep_features = False  # prefill keeps its rows' final-normed states (feature-reading drafters)
        self._features = net.embed.new_zeros(0, net.embed.shape[1])
        self._feature_ids: list[int] = []  # the ids whose rows `_features` holds
        self.static = None  # a runtime.graphs.StaticBatchForward, when the forward is static
        self.store = PrefixStore(default_budget() if store_bytes is None else store_bytes)
        self._per_position = kv_bytes_per_token(single.model)  # a position's keys and values, every layer

    @property
    def rows(self) -> int:
        return self.cache.rows

    def row_bytes(self, positions: int) -> int:
        """Bytes a row of `positions` holds in the batch's KV cache (every layer's keys and values)."""
        return positions * self._per_position

    @property
    def max_batch(self) -> int:
        return self.cache.max_batch

    @property
    def max_length(self) -> int:
        return self.single.max_length

    def lengths(self) -> list[int]:
        return list(self.cache.lengths)

    def prefill_start(self, prompt: Sequence[int], chunk: int = 128) -> int:
        """Begin prefilling `prompt` in the prefill cache, keeping the longest prefix it shares with
        what that cache holds (the previous prompt: a chat template's system prompt, say) or with a
        finished row's kept sequence (`keep`: a chat's earlier turns and answers); at most all but the
        prompt's last token, and only what leaves the rest of its prefill, in pieces ending at multiples
        of `chunk`, the bits of its own (`prefix_store.reusable`); with `keep_features`, rows whose
        features are kept too. Returns how many tokens were kept (they need no forward)."""
        held, limit, kept = self.single.tokens, min(len(self.single.tokens), len(prompt) - 1), 0
        featured = self._feature_ids if self.keep_features else held  # features kept for these rows
        limit = min(limit, len(featured))
        while kept < limit and held[kept] == prompt[kept] and featured[kept] == prompt[kept]:
            kept += 1
        until = self.invariant_until(chunk)
        kept = reusable(kept, len(held) // chunk * chunk, chunk, until)  # the held prompt: its own pieces
        cap = lambda entry, n: reusable(n, entry.aligned, chunk, until)  # noqa: E731
        hit = None if self.keep_features else self.store.best(prompt, beat=kept, cap=cap)  # no features there
        if hit is not None:  # a finished conversation's rows, answers included
            entry, kept = hit
            self.single.restore(entry.tokens[:kept], entry.k[:, :, :kept], entry.v[:, :, :kept])
        self.single.rollback(kept)
        return kept

    def invariant_until(self, chunk: int) -> int:
        """Positions up to which a prefill's attention is row-invariant within `invariant_prefill` (the
        fused kernels run this target), in whole pieces of `chunk`; 0 where nothing is."""
        return attention.KERNEL_CONTEXT // chunk * chunk if self._fused() else 0

    def _fused(self) -> bool:
        """Whether the fused kernels run this target's rows (`kernels.usable` on its weights' dtype and
        device; inference, whatever the caller's grad mode)."""
        return kernels.usable(self.net.embed.detach())

    def keep(self, row: int, context: Sequence[int], aligned: int | None = None) -> None:
        """Keep a leaving row's cached positions (its `context`'s first ones) for a prompt that comes back;
        `aligned`: its first positions prefilled in whole pieces (`prefix_store.reusable`)."""
        n = min(self.cache.lengths[row], len(context))
        if self.store.budget > 0 and n > 0:
            self.store.put(context[:n], self.cache.k[:, row, :, :n], self.cache.v[:, row, :, :n], aligned)

    def prefill(self, tokens: Sequence[int], first: bool = False) -> torch.Tensor:
        """Run a prompt chunk through the prefill cache after what it holds (`first`: from an empty
        cache); returns the chunk's last (1, V) logits. With `keep_features` on, the rows' final-normed
        states are kept beside the cache (`prefill_features`)."""
        if first:
            self.single.reset()
        if not self.keep_features:
            return self.single.extend(tokens, last_only=True)
        start = self.single.length
        if start > self._features.shape[0] or self._feature_ids[:start] != self.single.tokens:
            raise RuntimeError("prefill: the cached rows' features were not kept (begin with prefill_start)")
        out = self.single.forward(tokens, last_only=True, features=True)
        self._features = torch.cat([self._features[:start], out.features])
        self._feature_ids = list(self.single.tokens)
        return out.logits

    def prefill_features(self) -> torch.Tensor:
        """(length, H) the final-normed states of every prompt row the prefill cache holds
        (`keep_features` on, for every prompt since the first)."""
        return self._features[: self.single.length]

    @torch.inference_mode()  # the cache may have grown inside a forward: inference tensors
    def adopt(self) -> int:
        """Move the prefilled prompt into a new row; returns the row."""
        return self.cache.adopt(self.single.cache)

    @torch.inference_mode()
    def forward(self, blocks: Sequence[RowBlock]) -> list[torch.Tensor]:
        """One forward over every running row's block (one block per row, in row order); returns
        each row's (n_b, V) logits. With `static` set (runtime/forward/graphs.py) its static or graphed
        forward runs it."""
        return self.forward_features(blocks)[0]

    def run(self, blocks: Sequence[RowBlock]) -> list[TargetOutput]:
        """`forward_features` as one record per row (the round loop's call: `decoding/round.py`)."""
        logits, features = self.forward_features(blocks)
        return [TargetOutput(out, features=x) for out, x in zip(logits, features, strict=True)]

    @torch.inference_mode()
    def forward_features(self, blocks: Sequence[RowBlock]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`forward`, and each row's (n_b, H) final-normed states (what a feature-reading drafter
        observes)."""
        if len(blocks) != self.rows:
            raise ValueError(f"forward: {len(blocks)} blocks for {self.rows} rows")
        x, logits = self.static(blocks) if self.static is not None else (self.states_dynamic(blocks), None)
        sizes = [len(b.tokens) for b in blocks]  # x: (sum n_b, H)
        logits = self.single.logits(x) if logits is None else logits  # a graph may have run the head
        return list(logits.split(sizes)), list(x.split(sizes))

    @torch.inference_mode()
    def states_dynamic(self, blocks: Sequence[RowBlock]) -> torch.Tensor:
        """The forward over the running rows only, padded to the widest block, attending over the
        longest row's span: (sum n_b, H) the final-normed states of the blocks' rows, in order."""
        width = max(len(b.tokens) for b in blocks)
        self.cache.begin(width)
        dev = self.net.device
        lengths = torch.tensor(self.cache.lengths, dtype=torch.long)  # the starts, read on the host
        ids, positions, mask, valid = block_inputs(blocks, lengths, width, self.cache.span)
        lone = len(blocks) == 1 and self._fused()  # a lone row: one C++ call, where it runs
        x = (self.net.forward_lone if lone else self.net.forward_batch)(
            self.cache, ids.to(dev), positions.to(dev), mask
        )
        self.num_forwards += 1
        return x.flatten(0, 1)[pick_rows(valid.flatten(), dev)]

    @torch.inference_mode()
    def commit(self, row: int, keep: Sequence[int]) -> None:
        """Keep offsets `keep` (increasing) of the row's last block as its next positions."""
        self.cache.commit(row, torch.tensor(list(keep), dtype=torch.long))

    @torch.inference_mode()
    def remove(self, row: int) -> None:
        self.cache.remove(row)

    def clear(self) -> None:
        """Drop every row (after a failed forward: nothing of the batch is trusted)."""
        self.cache.lengths.clear()


def block_inputs(
    blocks: Sequence[RowBlock], starts: torch.Tensor, width: int, span: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batched forward's inputs (on the CPU) for one block per row, padded to `width`:
    (B, width) ids, (B, width) positions (starts + depth offsets), (B, width, span) bool mask (each
    valid row sees its row's context before starts[b] and its block's mask over the new rows; a
    padding row sees only itself) and (B, width) valid."""
    b = len(blocks)
    ids = torch.zeros(b, width, dtype=torch.long)
    offsets = torch.arange(width).repeat(b, 1)  # padding rows: consecutive positions
    new = torch.eye(width, dtype=torch.bool).repeat(b, 1, 1)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, block in enumerate(blocks):
        n = len(block.tokens)
        ids[i, :n] = torch.tensor(block.tokens, dtype=torch.long)
        if block.depths is not None:
            offsets[i, :n] = torch.tensor(block.depths, dtype=torch.long)
        new[i, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril() if block.mask is None else block.mask
        valid[i, :n] = True
    mask = (torch.arange(span)[None, None, :] < starts[:, None, None]) & valid[:, :, None]  # the context
    cols = starts[:, None] + torch.arange(width)  # (B, width): where the new rows land
    mask.scatter_(2, cols[:, None, :].expand(-1, width, -1), new)
    return ids, starts[:, None] + offsets, mask, valid


def pick_rows(valid: torch.Tensor, device: torch.device) -> slice | torch.Tensor:
    """The rows `valid` ((n,) bool, on the host) marks, as an index that reads nothing back from the
    device: a slice when they are the first ones (a lone request's block), else their positions."""
    count = int(valid.sum())
    if bool(valid[:count].all()):
        return slice(0, count)
    return valid.nonzero().squeeze(1).to(device, non_blocking=True)
