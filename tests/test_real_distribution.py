"""Speculative sampling through a real tiny Llama, its real KV cache and rollbacks, has the target's
law over whole generations (not only on the Markov-chain fakes): the law of every 3-token
continuation is enumerated exactly with full uncached forwards, and N speculative generations at
temperature 1 are tested against it. Broken verifiers in the same loop must fail the same test."""

import itertools

import pytest
import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.drafters import ModelDrafter
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.verifiers.speculative import SpeculativeSampling

from conftest import noisy_copy, tiny_llama
from oracles import CONTROL_SHARE, Named, always_accept, law_pvalue, resample_from_target

pytestmark = pytest.mark.slow

V, LENGTH, K, N = 6, 3, 2, 1500
PROMPT = [1, 4, 2]
SAMPLING = SamplingConfig(temperature=1.0)


def law_models():
    """(target, noisy-copy draft): float64 tiny Llamas over V tokens."""
    target = tiny_llama(vocab=V, layers=2, hidden=32, seed=3, dtype=torch.float64, init=0.2)
    return target, noisy_copy(target, 1.5, seed=4)


@pytest.fixture(scope="module")
def models():
    return law_models()


def exact_law(model) -> dict[tuple[int, ...], float]:
    """P(continuation) for every V**LENGTH continuation of PROMPT, from full uncached forwards."""
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=LENGTH):
            ids = torch.tensor([PROMPT + list(seq)])
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            law[seq] = float(sum(logp[len(PROMPT) - 1 + t, seq[t]] for t in range(LENGTH)).exp())
    return law


def pvalue(verifier, models, parts=None, n: int = N) -> tuple[float, int]:
    """(chi-square p-value of n generations against the exact law, number of rejected drafts).

    parts: (target cache owner, drafter) to test; default the HF cache and the noisy-copy draft."""
    target, draft = models
    owner, drafter = parts or (CachedModel(target.model), ModelDrafter(CachedModel(draft.model)))
    decoder = SpeculativeDecoder(owner, drafter, verifier, lambda: make_draft_policy(DraftConfig(K)))
    counts: dict[tuple[int, ...], int] = {}
    drafted = rejected = 0
    for i in range(n):
        res = collect(decoder.rounds(PROMPT, SAMPLING, LENGTH, Generators.from_seed(i)), StopConfig(LENGTH))
        counts[tuple(res.token_ids)] = counts.get(tuple(res.token_ids), 0) + 1
        drafted += res.stats.num_draft_tokens
        rejected += res.stats.num_draft_tokens - res.stats.num_accepted_draft_tokens
    assert drafted > 0  # speculation happened
    law = exact_law(target.model)
    assert abs(sum(law.values()) - 1) < 1e-9
    pvalue, cells = law_pvalue(counts, law, n)  # the rare continuations pooled into one cell
    assert cells >= 20  # the test has power: many distinct outcomes
    return pvalue, rejected


def control_n(broken) -> int:
    """Generations for a negative control of this law test (a broken rule or its name): always_accept
    fails by p = 0 at N, so it runs N // CONTROL_SHARE (oracles); resample_from_target (p ~ 1e-13 to
    1e-32 at N across the drafters tested) keeps N."""
    return N // CONTROL_SHARE if getattr(broken, "__name__", broken) == "always_accept" else N


def test_speculative_sampling_has_the_target_law_through_a_real_cache(models):
    p, rejected = pvalue(SpeculativeSampling(), models)
    assert rejected > 0 and p > 1e-3  # both branches of the rule ran


@pytest.mark.parametrize("broken", [always_accept, resample_from_target])
def test_negative_controls_fail(models, broken):
    assert pvalue(Named(broken), models, n=control_n(broken))[0] < 1e-3
