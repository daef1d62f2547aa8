"""The whole speculative loop samples from the target's law (testing.md A5/A6, algorithms.md §7).

Target and draft are Markov chains (exact laws), so the law of every (x_{t-1}, x_t) pair in a window
of k+2 generated tokens is known. Each position gets a chi-square test (Bonferroni); broken verifiers
injected into the same loop must fail it.
"""

import pytest
import torch
from scipy.stats import chisquare

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from quickdraft.sampling import logits_to_probs
from quickdraft.verifiers.speculative import SpeculativeSampling

from conftest import MarkovModel, random_transition
from oracles import CONTROL_SHARE, Named, always_accept, bonus_from_wrong_position, resample_from_target

V = 6


def _chains(seed):
    p = random_transition(V, seed)
    q = 0.6 * p + 0.4 * random_transition(V, seed + 100)  # a useful but imperfect draft
    return p, q


def _pair_pvalues(samples, prompt_last, law, length):
    """Bonferroni-ready p-values, one per position, of the (previous, current) token pairs."""
    x = torch.tensor(samples)  # (N, length)
    prev = torch.cat([torch.full((len(x), 1), prompt_last), x[:, :-1]], 1)
    marginal = torch.zeros(V, dtype=torch.float64)
    marginal[prompt_last] = 1.0
    pvalues = []
    for t in range(length):
        expected = (marginal[:, None] * law).reshape(-1) * len(x)
        counts = torch.bincount(prev[:, t] * V + x[:, t], minlength=V * V).double()
        mask = expected > 0
        if counts[~mask].sum() > 0:
            pvalues.append(0.0)  # a pair with zero probability under the target
        else:
            pvalues.append(float(chisquare(counts[mask].numpy(), expected[mask].numpy()).pvalue))
        marginal = marginal @ law
    return pvalues


def _sample_many(decoder, prompt, length, sampling, n):
    stop = StopConfig(max_new_tokens=length)
    out, drafted = [], 0
    for i in range(n):
        res = collect(decoder.rounds(prompt, sampling, length, Generators.from_seed(i)), stop)
        out.append(res.token_ids)
        drafted += res.stats.num_draft_tokens
    assert drafted > 0  # speculation happened
    return out


def _decoder(p, q, k, verifier, drafter="model"):
    if drafter == "chain":  # a 2-gram copy where one recurs, the model elsewhere: both kinds of q
        d = FallbackDrafter([PromptLookupDrafter(max_ngram=2, min_ngram=2), ModelDrafter(MarkovModel(q))])
    else:
        d = ModelDrafter(MarkovModel(q)) if drafter == "model" else PromptLookupDrafter(max_ngram=1)
    return SpeculativeDecoder(MarkovModel(p), d, verifier, lambda: make_draft_policy(DraftConfig(k)))


N = 6000


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize(
    "sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=3)], ids=["t1", "topk3"]
)
def test_speculative_loop_has_target_law(k, sampling):
    p, q = _chains(k)
    law = logits_to_probs(p.log(), sampling)  # the processed target chain
    samples = _sample_many(_decoder(p, q, k, SpeculativeSampling()), [0], k + 2, sampling, N)
    assert min(_pair_pvalues(samples, 0, law, k + 2)) > 1e-4 / (k + 2)


@pytest.mark.slow
def test_prompt_lookup_loop_has_target_law():
    p, q = _chains(7)
    samples = _sample_many(
        _decoder(p, q, 3, SpeculativeSampling(), drafter="ngram"),
        [0, 1, 2, 0, 1],
        5,
        SamplingConfig(temperature=1.0),
        N,
    )
    assert min(_pair_pvalues(samples, 1, p, 5)) > 1e-4 / 5


@pytest.mark.slow
def test_fallback_chain_loop_has_target_law():
    p, q = _chains(5)
    decoder = _decoder(p, q, 3, SpeculativeSampling(), drafter="chain")
    samples = _sample_many(decoder, [0, 1, 2, 0, 1], 6, SamplingConfig(temperature=1.0), N)
    assert min(_pair_pvalues(samples, 1, p, 6)) > 1e-4 / 6
    copy_rounds, model_rounds = decoder.drafter.rounds_by_drafter
    assert copy_rounds > 0.1 * N and model_rounds > 0.1 * N  # both kinds of round were sampled


@pytest.mark.slow
@pytest.mark.parametrize("broken", [always_accept, resample_from_target, bonus_from_wrong_position])
def test_negative_controls_fail(broken):
    k = 3
    p, q = _chains(k)
    n = N // CONTROL_SHARE if broken is always_accept else N  # the others: p ~ 1e-22 and 0 at one position
    samples = _sample_many(_decoder(p, q, k, Named(broken)), [0], k + 2, SamplingConfig(temperature=1.0), n)
    assert min(_pair_pvalues(samples, 0, p, k + 2)) < 1e-12


@pytest.mark.slow
def test_a_draft_restricted_to_a_sub_vocabulary_keeps_the_target_law():
    # what a restricted LM head drafts from: q = 0 off its K tokens (here 4 and 5 are never drafted)
    p, q = _chains(11)
    q = q.clone()
    q[:, 4:] = 0
    q = q / q.sum(-1, keepdim=True)
    samples = _sample_many(_decoder(p, q, 3, SpeculativeSampling()), [0], 5, SamplingConfig(temperature=1.0), N)
    assert min(_pair_pvalues(samples, 0, p, 5)) > 1e-4 / 5
    assert any(t in (4, 5) for s in samples for t in s)  # the target still emits them
