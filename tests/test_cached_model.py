"""Cache-rollback oracle (testing.md C8 / recipe 3): after any rollback the cache gives the logits of a
fresh no-cache forward over the committed tokens."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quickdraft.runtime.caches.cached_model import CachedModel

from conftest import tiny_llama
from oracles import naive_forward_logits

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extend_rollback_extend_matches_fresh_forward(dtype):
    m = tiny_llama(dtype=dtype).model
    cm = CachedModel(m)
    a, b, c = [1, 5, 9, 2, 7], [3, 3, 8], [4, 11]
    cm.extend(a)
    cm.extend(b)
    cm.rollback(len(a))
    got = cm.extend(c)
    want = naive_forward_logits(m, a + c)[-len(c) :]
    assert cm.length == len(a + c)
    assert torch.allclose(got, want, atol=TOL[dtype], rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.lists(st.integers(0, 63), min_size=1, max_size=6), st.integers(0, 6)), min_size=1, max_size=6
    )
)
def test_random_extend_rollback_sequences(ops):
    m = tiny_llama(dtype=torch.float64).model
    cm = CachedModel(m)
    committed: list[int] = []
    for tokens, drop in ops:
        logits = cm.extend(tokens)
        committed += tokens
        assert torch.allclose(logits, naive_forward_logits(m, committed)[-len(tokens) :], atol=1e-10, rtol=0)
        keep = max(0, len(committed) - drop)
        cm.rollback(keep)
        committed = committed[:keep]
        assert cm.tokens == committed


def test_sync_reuses_common_prefix_and_returns_last_logits():
    m = tiny_llama(dtype=torch.float64).model
    cm = CachedModel(m)
    cm.extend([1, 2, 3, 4, 5])
    logits = cm.sync([1, 2, 9, 10])
    assert cm.tokens == [1, 2, 9, 10]
    assert torch.allclose(logits[-1], naive_forward_logits(m, [1, 2, 9, 10])[-1], atol=1e-10, rtol=0)
    logits = cm.sync([1, 2, 9, 10])  # already cached: re-runs only the last token
    assert torch.allclose(logits[-1], naive_forward_logits(m, [1, 2, 9, 10])[-1], atol=1e-10, rtol=0)


def test_rollback_out_of_range_raises():
    cm = CachedModel(tiny_llama().model)
    cm.extend([1, 2])
    with pytest.raises(ValueError):
        cm.rollback(3)


def test_last_only_returns_one_row():
    cm = CachedModel(tiny_llama().model)
    assert cm.extend([1, 2, 3], last_only=True).shape == (1, 64)


def test_vocab_slice_drops_padded_tail():
    cm = CachedModel(tiny_llama(vocab=64).model, vocab_size=60)
    assert cm.extend([1, 2]).shape == (2, 60)


def test_a_restricted_head_gives_the_full_logits_on_its_ids_and_minus_inf_elsewhere():
    from quickdraft.errors import QuickdraftError

    m = tiny_llama(dtype=torch.float64).model
    V = m.config.vocab_size
    ids = torch.tensor([0, 5, 9, 3, 40])
    cm = CachedModel(m, head_ids=ids)
    off = torch.ones(V, dtype=torch.bool)
    off[ids] = False
    a, b = [1, 5, 9, 2, 7], [3, 3, 8]
    cm.extend(a)
    cm.extend(b)
    cm.rollback(len(a))
    for step in (lambda: cm.extend([4, 11]), lambda: cm.sync(a + [4, 11, 6])):
        got = step()
        n = got.shape[0]
        want = naive_forward_logits(m, cm.tokens)[-n:]
        assert got.shape == (n, V)
        assert torch.allclose(got[:, ids], want[:, ids], atol=1e-10, rtol=0)
        assert torch.isinf(got[:, off]).all() and (got[:, off] < 0).all()
    for bad in (torch.tensor([], dtype=torch.long), torch.tensor([V]), torch.tensor([-1])):
        with pytest.raises(QuickdraftError, match="head_ids"):
            CachedModel(m, head_ids=bad)
