"""Prompts that come back (issue #79 item 5): a finished row's cache rows, its answer included, are kept by
their ids in a store bounded by memory, and a later prompt that shares a prefix with one (a chat's next
turn, interleaved with other chats) prefills only what is new, with the same tokens as prefilled whole."""

from __future__ import annotations

import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.decoding.batch import BatchDecoder, run_batch
from quickdraft.decoding.batch_plan import BatchPlan
from quickdraft.decoding.collect import collect
from quickdraft.decoding.common import Generators
from quickdraft.drafters.model_free.suffix import SuffixDrafter
from quickdraft.runtime.caches.batched import BatchedTarget
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.caches.prefix_store import MIN_SHARED, PrefixStore, default_budget
from quickdraft.server.protocol import usage

from conftest import tiny_llama

GREEDY = SamplingConfig()


def _rows(n: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.full((2, 1, n, 4), fill)
    return k, k + 1


def test_the_store_keeps_the_longest_shared_prefix_and_drops_the_oldest_past_its_bytes():
    a, b = list(range(100, 140)), list(range(200, 240))
    one = 2 * _rows(40)[0].numel() * 4  # an entry of 40 float32 rows: its keys and values
    store = PrefixStore(budget=2 * one)
    store.put(a, *_rows(40, 1.0))
    store.put(b, *_rows(40, 2.0))
    entry, n = store.best(a + [7, 8])
    assert entry.tokens == a and n == 40 and float(entry.k[0, 0, 0, 0]) == 1.0
    assert store.best(a[:30] + [9] * 20)[1] == 30  # a shared prefix, then the prompt goes its own way
    assert store.best(a[: MIN_SHARED - 1] + [9] * 20) is None  # too little shared to be worth a load
    assert store.best(a + [7], beat=40) is None  # what the prefill cache holds already is as long
    assert store.best(a)[1] == 39  # at most all but the prompt's last id (its logits are needed)
    store.put(list(range(300, 340)), *_rows(40))  # past the budget: the oldest untouched one (b) goes
    assert store.best(b + [1]) is None and store.best(a + [1]) is not None and store.nbytes == 2 * one
    store.put(a + [5, 6], *_rows(42))  # a continuation replaces the entry it extends
    assert tuple(a) not in store.entries and store.best(a + [5, 6, 7])[1] == 42
    assert PrefixStore(budget=0).best(a) is None
    assert default_budget(available=64 << 30) == 8 << 30 and default_budget(available=8 << 30) == 2 << 30
    assert default_budget(available=None) in (0, default_budget())  # unreadable here: 0


def _alone(model, prompt, n):
    ar = Autoregressive(NativeCachedModel(model))
    return collect(ar.rounds(prompt, GREEDY, n, Generators.from_seed(0)), StopConfig(n)).token_ids


def _chats(model, store_bytes: int, drafter=None):
    """Two chats, interleaved: 1's turn 1, 2's turn 1, 1's turn 2, 2's turn 2; each turn's prompt is the
    chat so far (its answers included) and new ids. Returns each turn's (tokens, cached prompt tokens)."""
    plan = BatchPlan(None) if drafter is None else BatchPlan(None, fixed=4)
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(model), 2, store_bytes), drafter, plan)
    history = {1: [5, 6, 7, 8, 9] * 6, 2: [20, 21, 22, 23] * 7}
    out = []
    for chat, new in ((1, []), (2, []), (1, [30, 31, 32]), (2, [33, 34])):
        prompt = history[chat] + new
        (got,) = run_batch(dec, [(prompt, GREEDY, StopConfig(12))])
        out.append((got.tokens, got.stats.cached_prompt_tokens, prompt))
        history[chat] = prompt + got.tokens
    return out


def test_a_chats_next_turn_prefills_only_what_is_new_with_the_same_tokens():
    """Interleaved, each chat's second turn loads its first turn's rows (prompt and answer) from the store:
    only the new ids are prefilled, and the answer equals the prompt prefilled whole. Control: with no
    store, the prefill cache holds the other chat and nothing of this one is kept."""
    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64).model
    for drafter in (None, SuffixDrafter(None)):
        kept, plain = _chats(model, 1 << 24, drafter), _chats(model, 0, drafter)
        for (tokens, _, prompt), (tokens0, _, _) in zip(kept, plain, strict=True):
            assert tokens == tokens0 == _alone(model, prompt, 12)
        assert [c for _, c, _ in kept[2:]] == [len(kept[0][2]) + 12 - 1, len(kept[1][2]) + 12 - 1]
        assert [c for _, c, _ in plain[2:]] == [0, 0]  # control


def test_usage_reports_the_cached_prompt_tokens():
    got = usage(50, 7, cached=42)
    assert got["prompt_tokens_details"] == {"cached_tokens": 42} and got["total_tokens"] == 57
