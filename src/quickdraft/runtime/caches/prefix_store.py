"""Prompts that come back (issue #79 item 5): the KV rows of finished conversations, kept by their token
ids in a store bounded by memory, so a chat's next turn (its earlier turns, the answers included) or a
FIM session's next keystroke prefills only what is new.

`BatchedTarget` owns the store: a row that leaves hands its committed ids and its cache rows in (`put`),
and a joining prompt takes the entry that shares the longest prefix with it (`best`) when that beats
what the prefill cache already holds. The oldest entries go first when the bytes pass the budget
(llama.cpp's server keeps up to 8 GiB of prompts in RAM by default: `default_budget`). An entry is
a copy of the rows it kept (layers, kv heads, n, head dim), never a view into a cache that moves on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from quickdraft.host import available_memory
from quickdraft.runtime.caches.cached_model import shared_length

RAM_CEILING = 8 << 30  # the store's default bound: llama.cpp's server's `--cache-ram` default
MIN_SHARED = 16  # tokens an entry must share with a prompt to be loaded (less: a chat template's opening)


def default_budget(available: int | None = None) -> int:
    """The store's bytes: a quarter of the memory the host can give (MemAvailable), at most RAM_CEILING;
    0 where it cannot be read."""
    available = available_memory() if available is None else available
    return 0 if available is None else min(RAM_CEILING, available // 4)


def reusable(shared: int, aligned: int, chunk: int, until: int) -> int:
    """How many of `shared` positions taken from another sequence's cache leave a prompt's prefill the
    bits of its own (a batch's greedy answers the same under any load), where the prefill runs in pieces
    ending at multiples of `chunk` and its attention is row-invariant up to `until` positions (a multiple
    of `chunk`; `kernels.attention.invariant_prefill`): all of them up to `until`; beyond it SDPA's sums
    depend on the piece, so only whole pieces the other sequence prefilled itself (its first `aligned`
    positions: an answer's positions were decoded a row at a time, a prompt's last piece may be short)."""
    if shared <= until:
        return shared
    return max(until, min(shared, aligned) // chunk * chunk)


@dataclass
class Entry:
    """A kept sequence: its ids and their (layers, kv, n, d) keys and values."""

    tokens: list[int]
    k: torch.Tensor
    v: torch.Tensor
    aligned: int  # its first positions prefilled in whole pieces (`reusable`)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class PrefixStore:
    """Finished sequences' cache rows by their ids, oldest dropped first past `budget` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.nbytes = 0
        self.hits = 0  # prompts that loaded an entry

    def put(self, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor, aligned: int | None = None) -> None:
        """Keep `tokens` with their (layers, kv, n, d) rows (copied); an entry it extends is replaced.
        `aligned`: its first positions prefilled in whole pieces (default: all)."""
        if not tokens or 2 * k.numel() * k.element_size() > self.budget:  # checked before anything is copied
            return
        entry = Entry(list(tokens), k.clone(), v.clone(), len(tokens) if aligned is None else aligned)
        for key in [key for key in self.entries if shared_length(key, tokens) == len(key)]:
            self._drop(key)  # a prefix of the new entry: the new one holds it
        self.entries[tuple(tokens)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget:
            self._drop(next(iter(self.entries)))

    def best(self, prompt: Sequence[int], beat: int = 0, cap: Callable[[Entry, int], int] | None = None):
        """(the entry, the ids taken) sharing the longest prefix with `prompt` (at most all but its last id;
        at most `cap(entry, shared)`), if that is more than `beat` ids and at least MIN_SHARED, marked as
        the newest; else None."""
        limit = len(prompt) - 1
        found, length = None, max(beat, MIN_SHARED - 1)
        for key in self.entries:
            n = min(shared_length(key, prompt), limit)
            n = n if cap is None else cap(self.entries[key], n)
            if n > length:
                found, length = key, n
        if found is None:
            return None
        self.entries.move_to_end(found)
        self.hits += 1
        return self.entries[found], length

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
