"""One Llama block and one KV cache (runtime/forward/llama_block.py): the draft modules' block is the native
target's (a draft block loaded with a target layer's weights computes exactly that layer, batched,
incrementally over its cache, and under a tree mask), and the cache's verbs are oracle-checked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from quickdraft.models.draft_heads import DraftBlock, DraftHeadConfig, block_cache, init_from_target
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.forward.native import NativeLlama

from conftest import tiny_llama


def _target_and_block(layer: int = 1):
    """A float64 tiny target, and a draft block (with MLP) holding its layer `layer`'s weights."""
    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=7, dtype=torch.float64)
    cfg = DraftHeadConfig.from_target(target.model, "head")
    block = DraftBlock(cfg).double()
    init_from_target(SimpleNamespace(block=block), target.model, layer)  # the block's weights only
    return target, block


def _native_layer(target, x: torch.Tensor, layer: int) -> torch.Tensor:
    """(n, H) output of the native target's layer `layer` (not the last: no final norm) on states x (n, H)."""
    net = NativeLlama(target.model)
    out, _ = net.forward(net.new_cache(64), 0, hidden=x, layers=(layer, layer + 1))
    return out


def test_a_draft_block_is_the_native_targets_layer():
    target, block = _target_and_block()
    torch.manual_seed(0)
    x = torch.randn(9, 32, dtype=torch.float64)
    want = _native_layer(target, x, 1)
    batched = block(torch.stack([x, x]), torch.arange(9))  # (2, 9, H), causal, no cache
    assert torch.allclose(batched[0], want, atol=1e-12) and torch.allclose(batched[1], want, atol=1e-12)
    kv = block_cache(block.cfg, torch.float64, "cpu", capacity=4)  # grows while fed
    head = block(x[None, :5], torch.arange(5), kv)
    rows = [block(x[None, i : i + 1], torch.tensor([i]), kv) for i in range(5, 9)]
    assert kv.length == 9 and kv.capacity >= 9
    assert torch.allclose(torch.cat([head, *rows], dim=1)[0], want, atol=1e-12)


def test_selected_rows_are_the_rows_of_the_full_forward():
    """Training computes only the scored rows (`rows`): the other rows still give keys and values,
    so the selected outputs equal the full forward's at those rows."""
    _, block = _target_and_block()
    torch.manual_seed(1)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    rows = torch.rand(2, 9) < 0.5
    full = block(x, torch.arange(9))
    picked = block(x, torch.arange(9), rows=rows)
    assert picked.shape == (int(rows.sum()), 32) and torch.allclose(picked, full[rows], atol=1e-12)
    with pytest.raises(ValueError, match="cache-free"):
        block(x[:1], torch.arange(9), block_cache(block.cfg, torch.float64, "cpu"), rows=rows[:1])


def test_a_tree_mask_over_the_cache_matches_the_chain_it_selects():
    target, block = _target_and_block(layer=0)
    torch.manual_seed(1)
    x = torch.randn(6, 32, dtype=torch.float64)
    want = _native_layer(target, x, 0)
    kv = block_cache(block.cfg, torch.float64, "cpu")
    block(x[None, :4], torch.arange(4), kv)
    # two siblings at position 4 (rows 4 and 5 of x), each seeing the cache and itself only
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    out = block(x[None, 4:6], torch.tensor([4, 4]), kv, mask)[0]
    assert torch.allclose(out[0], want[4], atol=1e-12)
    assert not torch.allclose(out[1], want[5], atol=1e-6)  # control: row 5 saw no row 4, so it differs
    kv.rollback(4)
    alone = block(x[None, 5:6], torch.tensor([4]), kv)[0, 0]
    assert torch.allclose(out[1], alone, atol=1e-12)  # ...and equals row 5 put where row 4 was


def test_kv_cache_rollback_keep_and_growth():
    cache = KVCache(2, 1, 2, torch.float64, "cpu", capacity=2, limit=6)
    rows = torch.arange(8, dtype=torch.float64).view(1, 4, 2)
    cache.ensure(4)
    cache.write(1, 0, rows, -rows)
    cache.length = 4
    assert cache.capacity == 4 and torch.equal(cache.k[1, :, :4], rows[0].unsqueeze(0))
    cache.keep(torch.tensor([1, 3]), 1)  # rows 1 and 3 move to positions 1 and 2
    assert cache.length == 3
    assert cache.k[1, 0, :3, 0].tolist() == [0.0, 2.0, 6.0] and cache.v[1, 0, 2, 1].item() == -7.0
    cache.rollback(1)
    assert cache.length == 1
    with pytest.raises(ValueError):
        cache.rollback(2)  # beyond the valid positions
    with pytest.raises(ValueError):
        cache.ensure(7)  # beyond the model's context
    cache.ensure(6)
    assert cache.capacity == 6 and cache.k[1, 0, 2, 0].item() == 6.0  # grown, rows kept
