"""Drafter contracts: prompt lookup against its naive twin; the model drafter samples from exactly the q
it returns and keeps its cache equal to the committed prefix."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quickdraft.config import SamplingConfig
from quickdraft.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter, make_drafter, prompt_lookup
from quickdraft.drafters.base import DraftRequest
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.sampling import logits_to_probs

from conftest import noisy_copy, tiny_llama
from oracles import naive_forward_logits, naive_prompt_lookup


@settings(max_examples=300, deadline=None)
@given(ctx=st.lists(st.integers(0, 4), min_size=1, max_size=40), k=st.integers(1, 6), max_ngram=st.integers(1, 4))
def test_prompt_lookup_matches_naive_twin(ctx, k, max_ngram):
    assert prompt_lookup(ctx, k, max_ngram, 1) == naive_prompt_lookup(ctx, k, max_ngram, 1)


def test_prompt_lookup_examples():
    assert prompt_lookup([1, 2, 3, 4, 1, 2], 2) == [3, 4]
    assert prompt_lookup([5, 6, 7], 3) == []
    assert prompt_lookup([1, 2, 9, 1, 2, 8, 1, 2], 1) == [8]  # most recent match wins


def test_ngram_drafter_is_deterministic():
    prop = PromptLookupDrafter().propose([1, 2, 3, 1, 2], DraftRequest.chain(4), SamplingConfig(temperature=1.0), None)
    assert prop.tokens == [3, 1, 2] and prop.path_q() is None


def test_model_drafter_greedy_matches_argmax_chain():
    m = tiny_llama(dtype=torch.float64).model
    drafter = ModelDrafter(CachedModel(m))
    ctx = [3, 1, 4, 1, 5]
    prop = drafter.propose(ctx, DraftRequest.chain(4), SamplingConfig(), None)
    ids = list(ctx)
    for t in prop.tokens:
        assert t == int(naive_forward_logits(m, ids)[-1].argmax())
        ids.append(t)
    assert prop.path_q() is None
    assert drafter.model.tokens == ids[:-1]  # the last draft token is never fed


def test_model_drafter_samples_from_the_q_it_returns():
    target = tiny_llama(dtype=torch.float64)
    m = noisy_copy(target, 0.5).model
    drafter = ModelDrafter(CachedModel(m))
    cfg = SamplingConfig(temperature=0.9, top_k=5)
    ctx = [2, 7, 1]
    prop = drafter.propose(ctx, DraftRequest.chain(3), cfg, torch.Generator().manual_seed(0))
    ids = list(ctx)
    for i, t in enumerate(prop.tokens):
        q = logits_to_probs(naive_forward_logits(m, ids)[-1], cfg)
        assert torch.allclose(prop.path_q()[i], q, atol=1e-10)
        assert q[t] > 0
        ids.append(t)
    # same generator seed -> same proposal (after the drafter resyncs its cache)
    again = drafter.propose(ctx, DraftRequest.chain(3), cfg, torch.Generator().manual_seed(0))
    assert again.tokens == prop.tokens


def test_model_drafter_resyncs_after_rejection_and_bonus():
    m = tiny_llama(dtype=torch.float64).model
    drafter = ModelDrafter(CachedModel(m))
    drafter.propose([1, 2, 3], DraftRequest.chain(4), SamplingConfig(), None)
    # next round: 1 draft accepted then a correction token that the draft never saw
    new_ctx = [1, 2, 3, 9, 12]
    prop = drafter.propose(new_ctx, DraftRequest.chain(2), SamplingConfig(), None)
    assert prop.tokens[0] == int(naive_forward_logits(m, new_ctx)[-1].argmax())


def test_confidence_stop_ends_the_draft_early():
    m = tiny_llama(init=0.01).model  # flat logits: top-1 probability ~1/V
    prop = ModelDrafter(CachedModel(m)).propose(
        [1, 2], DraftRequest.chain(6, lambda logits, depth: False), SamplingConfig(), None
    )
    assert len(prop) == 1


def test_drafter_specs_build_ngram_bounds_and_fallback_chains():
    target = tiny_llama()
    ngram = make_drafter("ngram:4:2", target)
    assert (ngram.max_ngram, ngram.min_ngram) == (4, 2)
    chain = make_drafter("ngram:3:2+truncated:1", target)
    assert isinstance(chain, FallbackDrafter) and chain.name == "ngram+truncated:1"
    assert isinstance(chain.drafters[1], ModelDrafter)
    for bad in ["ngram+", "+ngram", "ngram:x", "ngram:2:3", "ngram+nope"]:
        with pytest.raises(QuickdraftError):
            make_drafter(bad, target)


def test_fallback_chain_uses_the_copy_where_it_matches_and_the_model_elsewhere():
    m = tiny_llama(dtype=torch.float64).model
    chain = FallbackDrafter([PromptLookupDrafter(max_ngram=3, min_ngram=2), ModelDrafter(CachedModel(m))])
    chain.begin([1, 2, 3])
    # no 2-token suffix recurs: the model drafts (its greedy chain)
    prop = chain.propose([1, 2, 3], DraftRequest.chain(2), SamplingConfig(), None)
    assert prop.tokens[0] == int(naive_forward_logits(m, [1, 2, 3])[-1].argmax())
    # "2 3" recurs: the copy drafts what followed it, and the model sits the round out
    ctx = [1, 2, 3, 9, 2, 3]
    assert chain.propose(ctx, DraftRequest.chain(2), SamplingConfig(), None).tokens == [9, 2]
    assert chain.rounds_by_drafter == [1, 1]
    # back to the model: it catches its cache up on the tokens it missed
    ctx = ctx + [9, 5, 7]
    prop = chain.propose(ctx, DraftRequest.chain(1), SamplingConfig(), None)
    assert prop.tokens[0] == int(naive_forward_logits(m, ctx)[-1].argmax())
    assert chain.drafters[1].model.tokens == ctx
    assert chain.rounds_by_drafter == [1, 2]


@pytest.mark.parametrize("bad", ["0", "4", "x", "-3"])
def test_a_model_drafters_window_is_refused_unless_past_its_sink(bad):
    from quickdraft.drafters.draft_models.model_drafter import parse_model

    with pytest.raises(QuickdraftError, match="window must be an integer"):
        parse_model(f"some/draft;window={bad}")
    assert parse_model("some/draft;vocab=64;window=256")[1].window == 256
