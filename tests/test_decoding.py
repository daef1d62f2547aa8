"""End-to-end decode loops on tiny models: greedy SD == plain greedy, draft == target accepts
everything, exact EOS / budget / stop handling, seeds, cache invariants (testing.md C1-C10)."""

import pytest
import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Autoregressive, Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.verifiers import make_verifier

from conftest import noisy_copy, tiny_llama
from oracles import naive_forward_logits, naive_greedy

PROMPTS = [[1, 2, 3], [7, 7, 7, 7], [5, 9, 13, 2, 40, 41, 5, 9], [60], [33, 12, 33, 12, 33]]


GREEDY = SamplingConfig()


def run(decoder, prompt, max_new_tokens=40, sampling=GREEDY, eos=(), seed=0):
    stop = StopConfig(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
    return collect(decoder.rounds(prompt, sampling, max_new_tokens, Generators.from_seed(seed)), stop)


def sd(target, drafter, sampling=GREEDY, k=4, schedule="fixed"):
    cfg = DraftConfig(num_draft_tokens=k, schedule=schedule, confidence_threshold=0.3)
    return SpeculativeDecoder(
        CachedModel(target.model), drafter, make_verifier(None, sampling), lambda: make_draft_policy(cfg)
    )


def drafters_for(target, name):
    if name == "ngram":
        return PromptLookupDrafter()
    if name == "noisy":
        return ModelDrafter(CachedModel(noisy_copy(target, 0.3).model))
    if name == "chain":  # the copy where a 2-gram recurs, the noisy model elsewhere
        noisy = ModelDrafter(CachedModel(noisy_copy(target, 0.3).model))
        return FallbackDrafter([PromptLookupDrafter(max_ngram=3, min_ngram=2), noisy])
    return ModelDrafter(CachedModel(target.model))  # "same": draft == target


# --- C1: greedy speculative == greedy plain -----------------------------------------------------


@pytest.mark.parametrize("drafter", ["ngram", "noisy", "same", "chain"])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_sd_equals_plain_greedy_float64(drafter, k):
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    chosen = drafters_for(target, drafter)
    spec = sd(target, chosen, k=k)
    drafted = accepted = 0
    for prompt in PROMPTS:
        want = run(plain, prompt).token_ids
        got = run(spec, prompt)
        assert got.token_ids == want, f"prompt {prompt}"
        drafted += got.stats.num_draft_tokens
        accepted += got.stats.num_accepted_draft_tokens
    assert drafted > 0 and accepted > 0  # speculation happened and paid somewhere
    if drafter == "chain":
        assert min(chosen.rounds_by_drafter) > 0  # both stages drafted


def test_plain_greedy_equals_full_recompute_oracle():
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    for prompt in PROMPTS[:3]:
        assert run(plain, prompt, 20).token_ids == naive_greedy(target.model, prompt, 20)


@pytest.mark.parametrize("schedule", ["heuristic", "confidence"])
def test_adaptive_schedules_keep_greedy_output(schedule):
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    spec = sd(target, drafters_for(target, "noisy"), k=3, schedule=schedule)
    lengths = set()
    for prompt in PROMPTS:
        got = run(spec, prompt, 60)
        assert got.token_ids == run(plain, prompt, 60).token_ids
        lengths.add(len(got.stats.drafted_per_position))
        assert got.stats.num_draft_tokens > 0
    if schedule == "heuristic":
        assert max(lengths) > 3  # the schedule grew the draft beyond its start


def _top2_margin(logits):
    top = torch.topk(logits.double(), 5)
    return float(top.values[0] - top.values[1]), top.indices.tolist()


def test_greedy_sd_equals_plain_greedy_float32_with_near_tie_hatch():
    """fp32: exact, except a divergence at a documented near-tie (testing.md 4.3 item 2)."""
    target = tiny_llama(dtype=torch.float32, layers=3, hidden=64, vocab=128, seed=3)
    plain = Autoregressive(CachedModel(target.model))
    spec = sd(target, drafters_for(target, "noisy"), k=4)
    hatches, prompts = 0, [[i, (i * 7) % 128, (i * 13) % 128] for i in range(20)]
    for prompt in prompts:
        want, got = run(plain, prompt, 48).token_ids, run(spec, prompt, 48)
        assert got.stats.num_draft_tokens > 0
        if got.token_ids != want:
            pos = next(i for i, (a, b) in enumerate(zip(want, got.token_ids, strict=False)) if a != b)
            margin, top5 = _top2_margin(naive_forward_logits(target.model, prompt + want[:pos])[-1])
            assert margin < 1e-4 and got.token_ids[pos] in top5, f"real divergence at {pos} for {prompt}"
            hatches += 1
    assert hatches <= max(1, len(prompts) // 100)


# --- B3: draft == target accepts everything ------------------------------------------------------


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=3)])
def test_draft_equal_to_target_accepts_all(sampling):
    target = tiny_llama(dtype=torch.float64)
    spec = sd(target, drafters_for(target, "same"), sampling, k=4)
    out = run(spec, [1, 2, 3], 41, sampling)
    s = out.stats
    assert s.num_draft_tokens > 0
    assert s.draft_acceptance_rate == 1.0
    assert s.mean_acceptance_length == 5.0  # every round: 4 drafts + bonus
    assert s.num_target_forwards == 1 + 40 // 5
    assert s.accepted_lengths == [1] + [5] * 8  # tokens committed per target forward (prefill first)


# --- C4 / C5: EOS inside a draft, max_new_tokens edges ---------------------------------------------


def test_eos_inside_accepted_draft_ends_generation_exactly():
    target = tiny_llama(dtype=torch.float64)
    prompt = [5, 9, 13]
    reference = run(Autoregressive(CachedModel(target.model)), prompt, 30).token_ids
    eos = reference[6]  # lands mid-block with k=4 (prefill token, then blocks of 5)
    first = reference.index(eos)
    spec = sd(target, drafters_for(target, "same"), k=4)
    out = run(spec, prompt, 30, eos=[eos])
    assert out.token_ids == reference[: first + 1]  # the terminating EOS is emitted, nothing after it
    assert out.finish_reason == "stop"
    assert out.stats.num_accepted_draft_tokens == first  # drafts after EOS are not counted
    assert out.stats.draft_acceptance_rate == 1.0  # ... neither as accepted nor as drafted
    assert out.stats.num_new_tokens == first + 1


@pytest.mark.parametrize("drafter", ["ngram", "same"])
@pytest.mark.parametrize("max_new", [1, 2, 4, 5, 6, 9, 2049])
def test_max_new_tokens_is_exact(drafter, max_new):
    target = tiny_llama(dtype=torch.float64, layers=1, hidden=16)
    plain = Autoregressive(CachedModel(target.model))
    spec = sd(target, drafters_for(target, drafter), k=4)
    prompt = [1, 2, 3, 1, 2]  # a repeat, so prompt lookup has something to propose
    want = run(plain, prompt, max_new).token_ids
    got = run(spec, prompt, max_new)
    assert len(got.token_ids) == max_new and got.finish_reason == "length"
    assert got.token_ids == want
    assert got.stats.num_new_tokens == max_new
    if drafter == "same" and max_new > 2 or max_new > 100:
        assert got.stats.num_draft_tokens > 0


def test_eos_as_first_token():
    target = tiny_llama(dtype=torch.float64)
    first = run(Autoregressive(CachedModel(target.model)), [1, 2], 1).token_ids[0]
    out = run(sd(target, drafters_for(target, "same")), [1, 2], 10, eos=[first])
    assert out.token_ids == [first] and out.finish_reason == "stop"


# --- C8: the target cache equals a fresh prefill of the committed tokens after every round ---------


def test_caches_hold_committed_prefix_after_every_round():
    target = tiny_llama(dtype=torch.float64)
    cached = CachedModel(target.model)
    drafter = ModelDrafter(CachedModel(noisy_copy(target, 0.3).model))
    spec = SpeculativeDecoder(
        cached, drafter, make_verifier(None, SamplingConfig()), lambda: make_draft_policy(DraftConfig(4))
    )
    prompt = [3, 1, 4]
    committed = list(prompt)
    rounds = spec.rounds(prompt, SamplingConfig(), 40, Generators.from_seed(0))
    for _, rnd in zip(range(12), rounds, strict=False):
        before = list(committed)
        committed += rnd.tokens
        assert cached.tokens == committed[:-1]
        _assert_cache_equals_fresh_prefill(cached, target.model, committed[:-1])
        # The drafter syncs lazily at its next propose: its cache holds the previous context plus
        # this round's drafts (the last one unfed), and equals a fresh prefill of exactly that.
        if rnd.num_draft_tokens:
            assert drafter.model.tokens[: len(before)] == before
        _assert_cache_equals_fresh_prefill(drafter.model, drafter.model.model, drafter.model.tokens)
    rounds.close()


def _assert_cache_equals_fresh_prefill(cached, model, tokens):
    if not tokens:
        assert cached.length == 0
        return
    fresh = CachedModel(model)
    fresh.extend(tokens)
    for layer, ref in zip(cached.cache.layers, fresh.cache.layers, strict=True):
        assert torch.allclose(layer.keys, ref.keys, atol=1e-10)
        assert torch.allclose(layer.values, ref.values, atol=1e-10)


# --- C10: seeds --------------------------------------------------------------------------------------


def test_seeds_reproduce_and_differ():
    target = tiny_llama(dtype=torch.float32)
    sampling = SamplingConfig(temperature=1.0)
    spec = sd(target, drafters_for(target, "noisy"), sampling, k=3)
    a = run(spec, [1, 2, 3], 30, sampling, seed=11)
    b = run(spec, [1, 2, 3], 30, sampling, seed=11)
    assert a.token_ids == b.token_ids and a.stats.num_draft_tokens > 0
    others = {tuple(run(spec, [1, 2, 3], 30, sampling, seed=s).token_ids) for s in range(12, 20)}
    assert len(others - {tuple(a.token_ids)}) > 0


def test_a_windowed_draft_reads_the_prompt_cut_and_the_output_is_unchanged():
    """`;window=N`: the draft (the target itself, so every draft it sees whole is right) reads the
    prompt's first SINK tokens and its last N - SINK, then everything generated; greedy output equals
    plain decoding, speculation happened, and the draft's cache holds the cut sequence only."""
    from quickdraft.drafters.draft_models.window import SINK

    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    prompt = [(7 * i + 3) % 60 + 1 for i in range(40)]
    window = 12
    drafter = ModelDrafter(CachedModel(target.model), window=window)
    got = run(sd(target, drafter), prompt, 30)
    assert got.token_ids == run(plain, prompt, 30).token_ids
    assert got.stats.num_accepted_draft_tokens > 0
    seen = drafter.model.tokens
    assert seen[:SINK] == prompt[:SINK] and seen[SINK:window] == prompt[-(window - SINK) :]
    assert seen[window:] == got.token_ids[: len(seen) - window]
    # the control: without a window the draft reads the whole prompt
    whole = ModelDrafter(CachedModel(target.model))
    run(sd(target, whole), prompt, 30)
    assert whole.model.tokens[: len(prompt)] == prompt


def test_a_fitted_window_reads_no_more_prompt_than_the_generation_may_add():
    """The fast form's window (`fitted`) reads max(FIT_MIN, the budget) prompt tokens, at most its size,
    for a generation of at most `budget` new tokens: greedy output still equals plain decoding, and the
    draft's cache holds the shorter cut. Control: the same window not fitted reads its whole size."""
    from quickdraft.drafters.draft_models.window import FIT_MIN, SINK, fitted_size

    assert [fitted_size(256, b) for b in (None, 1000, 256, 128, 64, 16)] == [256, 256, 256, 128, 64, 64]
    assert fitted_size(32, 16) == 32  # a window under FIT_MIN keeps its size
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(CachedModel(target.model))
    prompt = [(7 * i + 3) % 60 + 1 for i in range(200)]
    budget, size = 30, 128
    fitted = ModelDrafter(CachedModel(target.model), window=size)
    fitted.window.fitted = True
    got = run(sd(target, fitted), prompt, budget)
    assert got.token_ids == run(plain, prompt, budget).token_ids
    assert got.stats.num_accepted_draft_tokens > 0
    seen = fitted.model.tokens
    assert fitted.window.read == FIT_MIN
    assert seen[:SINK] == prompt[:SINK] and seen[SINK:FIT_MIN] == prompt[-(FIT_MIN - SINK) :]
    assert seen[FIT_MIN:] == got.token_ids[: len(seen) - FIT_MIN]
    fixed = ModelDrafter(CachedModel(target.model), window=size)
    run(sd(target, fixed), prompt, budget)
    assert fixed.window.read == size and fixed.model.tokens[SINK:size] == prompt[-(size - SINK) :]
