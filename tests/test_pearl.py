"""PEARL's state machine run sequentially: greedy == plain decoding, ablations off == vanilla SD token for
token (same random streams), the target law when sampling, token conservation and cache invariants."""

from __future__ import annotations

import pytest
import torch
from test_decoding import PROMPTS, _assert_cache_equals_fresh_prefill
from test_distribution import V, _chains, _pair_pvalues

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Autoregressive, Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.decoding.pearl import PearlDecoder
from quickdraft.decoding.pearl_logic import PearlConfig, PearlLogic, PearlVerdict
from quickdraft.drafters import ModelDrafter, PromptLookupDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.verifiers import SpeculativeSampling, make_verifier

from conftest import MarkovModel, noisy_copy, random_transition, tiny_llama

GREEDY = SamplingConfig()
ABLATIONS = [(True, True), (True, False), (False, True), (False, False)]


def run(decoder, prompt, max_new_tokens=40, sampling=GREEDY, seed=0, eos=()):
    stop = StopConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
    return collect(decoder.rounds(prompt, sampling, max_new_tokens, Generators.from_seed(seed)), stop)


def pearl(target_model, drafter, gamma, pre=True, post=True, sampling=GREEDY):
    cfg = PearlConfig(gamma=gamma, pre_verify=pre, post_verify=post)
    return PearlDecoder(CachedModel(target_model), drafter, make_verifier(None, sampling), cfg, gamma)


def _drafter(target, name):
    if name == "ngram":
        return PromptLookupDrafter()
    if name == "same":
        return ModelDrafter(CachedModel(target.model))
    return ModelDrafter(CachedModel(noisy_copy(target, 0.3).model))


@pytest.mark.parametrize("pre,post", ABLATIONS)
@pytest.mark.parametrize("drafter,gamma", [("noisy", 1), ("noisy", 4), ("ngram", 3), ("same", 5)])
def test_greedy_pearl_equals_plain_greedy_float64(pre, post, drafter, gamma):
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    dec = pearl(target.model, _drafter(target, drafter), gamma, pre, post)
    drafted = accepted = 0
    for prompt in PROMPTS:
        got = run(dec, prompt)
        assert got.token_ids == run(plain, prompt).token_ids, f"prompt {prompt}"
        drafted += got.stats.num_draft_tokens
        accepted += got.stats.num_accepted_draft_tokens
    assert drafted > 0 and accepted > 0


def test_greedy_pearl_float32_real_sized_steps():
    target = tiny_llama(dtype=torch.float32, layers=3, hidden=64)
    plain = Autoregressive(CachedModel(target.model))
    dec = pearl(target.model, _drafter(target, "noisy"), 4)
    for prompt in PROMPTS:
        assert run(dec, prompt, 60).token_ids == run(plain, prompt, 60).token_ids


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=5)])
@pytest.mark.parametrize("k", [1, 4])
def test_ablations_off_is_vanilla_sd_token_for_token(sampling, k):
    target = tiny_llama(dtype=torch.float64)
    draft = noisy_copy(target, 0.3)
    vanilla = SpeculativeDecoder(
        CachedModel(target.model),
        ModelDrafter(CachedModel(draft.model)),
        make_verifier(None, sampling),
        lambda: make_draft_policy(DraftConfig(k)),
    )
    dec = pearl(target.model, ModelDrafter(CachedModel(draft.model)), k, False, False, sampling)
    for seed, prompt in enumerate(PROMPTS):
        a, b = run(vanilla, prompt, 30, sampling, seed), run(dec, prompt, 30, sampling, seed)
        assert a.token_ids == b.token_ids
        assert a.stats.accepted_lengths == b.stats.accepted_lengths
        assert a.stats.num_accepted_draft_tokens == b.stats.num_accepted_draft_tokens > 0


def test_full_pearl_uses_post_verify_and_fewer_target_forwards_than_tokens():
    target = tiny_llama(dtype=torch.float64)
    dec = pearl(target.model, _drafter(target, "same"), 4)
    res = run(dec, [1, 2, 3], 40)
    # draft == target: every token accepted; after one PRE round, POST rounds commit gamma tokens each
    assert res.stats.accepted_lengths[:4] == [1, 1, 4, 4]
    assert res.stats.draft_acceptance_rate == 1.0
    assert res.stats.extra.get("pearl_runs", 0) == 0  # no rejection, no finished run


def test_pearl_mean_accepted_tokens_counts_runs_up_to_each_rejection():
    target = tiny_llama(dtype=torch.float64)
    res = run(pearl(target.model, _drafter(target, "noisy"), 3), [5, 9, 13, 2], 60)
    runs, tokens = res.stats.extra["pearl_runs"], res.stats.extra["pearl_run_tokens"]
    assert runs > 0 and tokens >= runs
    assert tokens <= res.stats.num_new_tokens


def test_state_machine_conserves_tokens_and_caches_follow():
    target = tiny_llama(dtype=torch.float64)
    cached = CachedModel(target.model)
    config = PearlConfig(gamma=3, pre_verify=True)  # PRE and POST rounds both
    dec = PearlDecoder(cached, _drafter(target, "noisy"), make_verifier(None, GREEDY), config, 3)
    prompt = [3, 1, 4]
    committed = list(prompt)
    rounds = dec.rounds(prompt, GREEDY, 60, Generators.from_seed(0))
    kinds = set()
    for _, rnd in zip(range(25), rounds, strict=False):
        assert len(rnd.tokens) >= 1  # every round commits at least one token
        assert len(rnd.tokens) in (rnd.num_accepted, rnd.num_accepted + 1)
        committed += rnd.tokens
        assert cached.tokens == committed[:-1]
        _assert_cache_equals_fresh_prefill(cached, target.model, committed[:-1])
        kinds.add(rnd.num_draft_tokens)
    rounds.close()
    assert {1, 3} <= kinds  # PRE rounds judge 1 token, POST rounds gamma


def test_logic_truth_table():
    logic = PearlLogic([1, 2], gamma=3)
    assert logic.kind == "pre" and logic.draft_job() == ([1, 2], 3)
    assert PearlLogic([1, 2], gamma=3, max_length=4).draft_job() == (
        [1, 2],
        2,
    )  # never past the end and logic.target_job() == [2]
    # PRE accept: d1 committed, d2 d3 pending, POST next
    rnd = logic.apply(PearlVerdict(1, -1), [7, 8, 9], None)
    assert rnd.tokens == [7] and logic.pending == [8, 9] and logic.kind == "post"
    assert logic.draft_job() == ([1, 2, 7, 8, 9], 3) and logic.target_job() == [7, 8, 9]
    # POST all accepted (8, 9 and the new e1 = 4): no bonus; 5, 6 pending
    rnd = logic.apply(PearlVerdict(3, -1), [4, 5, 6], None)
    assert rnd.tokens == [8, 9, 4] and logic.pending == [5, 6] and logic.target_cache_length == 5
    # POST rejection at the second candidate: correction 30, back to PRE, pending dropped
    rnd = logic.apply(PearlVerdict(1, 30), [40, 41, 42], None)
    assert rnd.tokens == [5, 30] and logic.pending == [] and logic.kind == "pre"
    assert rnd.events == {"pearl_runs": 1, "pearl_run_tokens": 6}
    # PRE rejection
    rnd = logic.apply(PearlVerdict(0, 11), [12, 13, 14], None)
    assert rnd.tokens == [11] and logic.kind == "pre" and logic.committed[-1] == 11


def test_gamma_validation_and_auto_rule():
    with pytest.raises(QuickdraftError):
        PearlConfig(gamma=0)
    from quickdraft.decoding.pearl import DEFAULT_GAMMA, gamma_from_costs

    assert gamma_from_costs(0.040, 0.010) == 4 and gamma_from_costs(0.040, 0.001) == 16
    assert gamma_from_costs(0.040, None) == DEFAULT_GAMMA  # model-free drafters, sequential and parallel alike


N = 6000


@pytest.mark.slow
@pytest.mark.parametrize("pre,post", [(True, True), (True, False), (False, True)])
def test_pearl_loop_has_target_law(pre, post):
    p, q = _chains(11)
    sampling = SamplingConfig(temperature=1.0)
    cfg = PearlConfig(gamma=2, pre_verify=pre, post_verify=post)
    out, drafted = [], 0
    length = 5
    for i in range(N):
        dec = PearlDecoder(MarkovModel(p), ModelDrafter(MarkovModel(q)), SpeculativeSampling(), cfg, 2)
        res = collect(dec.rounds([0], sampling, length, Generators.from_seed(i)), StopConfig(max_new_tokens=length))
        out.append(res.token_ids)
        drafted += res.stats.num_draft_tokens
    assert drafted > 0
    assert min(_pair_pvalues(out, 0, p, length)) > 1e-4 / length


@pytest.mark.slow
def test_pearl_law_test_fails_for_a_broken_verifier():
    from oracles import CONTROL_SHARE, Named, always_accept

    p, q = _chains(11)
    sampling = SamplingConfig(temperature=1.0)
    out = []
    for i in range(N // CONTROL_SHARE):  # p < 1e-180 at N / 2
        dec = PearlDecoder(MarkovModel(p), ModelDrafter(MarkovModel(q)), Named(always_accept), PearlConfig(gamma=2), 2)
        out.append(
            collect(dec.rounds([0], sampling, 5, Generators.from_seed(i)), StopConfig(max_new_tokens=5)).token_ids
        )
    assert min(_pair_pvalues(out, 0, p, 5)) < 1e-12
    assert V == 6
    _ = random_transition


def test_pre_verify_is_on_in_two_processes_and_off_in_one_unless_given():
    from quickdraft.decoding.pearl_worker import ParallelSpec

    auto = PearlConfig()
    assert auto.resolved(parallel=True).pre_verify is True and auto.resolved(parallel=False).pre_verify is False
    assert PearlConfig(pre_verify=True).resolved(parallel=False).pre_verify is True
    target = tiny_llama(dtype=torch.float64)
    dec = PearlDecoder(CachedModel(target.model), PromptLookupDrafter(), make_verifier(None, GREEDY), auto, 3)
    assert dec.config.pre_verify is False
    spec = ParallelSpec(None, (), "float32", auto, None, ((0,), (1,)))
    assert spec.pearl.pre_verify is True
