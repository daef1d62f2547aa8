"""Verifier truth tables and statistical losslessness, with negative controls (testing.md A1-A10)."""

import pytest
import torch
from scipy.stats import chisquare

from quickdraft.config import SamplingConfig
from quickdraft.sampling import logits_to_probs
from quickdraft.verifiers import greedy_verify, make_verifier, speculative_verify

from oracles import always_accept, bonus_from_wrong_position, resample_from_target, residual_without_clamp

V = 8


def one_hot_rows(tokens, vocab=V):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).double()


# --- A1: greedy truth table ----------------------------------------------------------------


@pytest.mark.parametrize(
    "draft, target, n, nxt",
    [
        ([1, 2, 3], [1, 2, 3, 4], 3, 4),  # perfect match -> k drafts + bonus
        ([1, 5, 3], [1, 2, 3, 4], 1, 2),  # mismatch at 2nd position -> prefix + target argmax
        ([7, 2, 3], [1, 2, 3, 4], 0, 1),  # mismatch at first position
        ([1], [1, 6], 1, 6),  # single draft
        ([], [5], 0, 5),  # empty draft: only the bonus
    ],
)
def test_greedy_truth_table(draft, target, n, nxt):
    p = one_hot_rows(target).unsqueeze(0)
    d = torch.tensor([draft], dtype=torch.long).reshape(1, len(draft))
    for verdict in (greedy_verify(d, p), speculative_verify(d, None, p, torch.Generator().manual_seed(0))):
        assert verdict.num_accepted.tolist() == [n]
        assert verdict.next_tokens.tolist() == [nxt]


def test_greedy_batch_rows_with_different_accept_lengths():
    d = torch.tensor([[1, 2, 3], [1, 2, 0], [4, 4, 4]])
    p = torch.stack([one_hot_rows([1, 2, 3, 7]), one_hot_rows([1, 2, 3, 7]), one_hot_rows([5, 4, 4, 4])])
    v = greedy_verify(d, p)
    assert v.num_accepted.tolist() == [3, 2, 0]
    assert v.next_tokens.tolist() == [7, 3, 5]


def test_no_token_after_first_rejection_is_accepted():
    # A2: the target would accept position 2 but rejects position 1: only 1 token counts.
    d = torch.tensor([[1, 2, 3]])
    p = one_hot_rows([1, 6, 3, 4]).unsqueeze(0)
    for v in (greedy_verify(d, p), speculative_verify(d, None, p, torch.Generator().manual_seed(0))):
        assert v.num_accepted.tolist() == [1]
        assert v.next_tokens.tolist() == [6]


# --- A7 / A8 / A9: equal distributions, zero probabilities, out-of-range ids -------------------


def test_draft_equal_to_target_accepts_everything():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 4, V, dtype=torch.float64, generator=g), -1)  # (B, k+1, V)
    q = p[:, :3].clone()
    d = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(64, 3)
    v = speculative_verify(d, q, p, g)
    assert v.num_accepted.tolist() == [3] * 64
    assert not torch.isnan(p).any()


def test_zero_target_probability_is_never_accepted_even_with_u_zero(monkeypatch):
    p = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", lambda *size, **k: torch.zeros(*size, dtype=torch.float64))  # u = 0
    v = speculative_verify(torch.tensor([[0]]), q, p, torch.Generator().manual_seed(0))
    assert v.num_accepted.tolist() == [0]
    assert v.next_tokens.tolist() == [1]  # the residual lies in p's support


def test_zero_draft_probability_does_not_divide_by_zero():
    p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    v = speculative_verify(torch.tensor([[1]]), q, p, torch.Generator().manual_seed(0))
    assert v.num_accepted.tolist() == [1]


@pytest.mark.parametrize("bad", [-1, V, V + 5])
def test_out_of_range_draft_ids_are_rejected(bad):
    p = torch.softmax(torch.randn(1, 3, V, dtype=torch.float64), -1)
    for v in (
        speculative_verify(torch.tensor([[bad, 1]]), None, p, torch.Generator().manual_seed(0)),
        greedy_verify(torch.tensor([[bad, 1]]), p),
    ):
        assert v.num_accepted.tolist() == [0]
        assert 0 <= int(v.next_tokens[0]) < V


def test_make_verifier_by_name():
    assert make_verifier(None, SamplingConfig()).name == "greedy"
    assert make_verifier(None, SamplingConfig(temperature=1.0)).name == "speculative"


# --- A4 / A6: distribution of the first emitted token, and negative controls --------------------


def _first_token_law(verifier, p, q, d_sampler, n, seed, k):
    """Empirical counts of the first emitted token over n independent single-row verifications
    (vectorised as a batch of n rows)."""
    g = torch.Generator().manual_seed(seed)
    P = p.expand(n, k + 1, V).contiguous()
    Q = None if q is None else q.expand(n, k, V).contiguous()
    d = d_sampler(n, g)
    v = verifier(d, Q, P, g)
    first = torch.where(v.num_accepted > 0, d[:, 0], v.next_tokens)
    return torch.bincount(first, minlength=V).double()


def _chi2_pvalue(counts, probs):
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token outside the target's support was emitted"
    return chisquare(counts[mask].numpy(), expected[mask].numpy()).pvalue


def _random_pq(seed, k):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(1, k + 1, V, dtype=torch.float64, generator=g), -1)
    q = torch.softmax(2 * torch.randn(1, k, V, dtype=torch.float64, generator=g), -1)
    return p, q


def _sampled_drafts(q, k):
    return lambda n, g: torch.multinomial(q.expand(n, k, V).reshape(-1, V), 1, True, generator=g).reshape(n, k)


N = 10_000  # the negative controls below fail at this size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_token_has_target_law(seed):
    p, q = _random_pq(seed, k=3)
    counts = _first_token_law(speculative_verify, p, q, _sampled_drafts(q, 3), N, seed, 3)
    assert _chi2_pvalue(counts, p[0, 0]) > 1e-4
    # and the draft really was used (acceptance strictly between 0 and 1)
    plain = torch.multinomial(p[0, 0], N, True, generator=torch.Generator().manual_seed(99))
    tv_spec = (counts / N - p[0, 0]).abs().sum() / 2
    tv_plain = (torch.bincount(plain, minlength=V) / N - p[0, 0]).abs().sum() / 2
    assert tv_spec - tv_plain < 0.02


def test_first_token_law_with_deterministic_proposal():
    p, _ = _random_pq(5, k=2)
    drafts = lambda n, g: torch.full((n, 2), 3, dtype=torch.long)  # noqa: E731
    counts = _first_token_law(speculative_verify, p, None, drafts, N, 5, 2)
    assert _chi2_pvalue(counts, p[0, 0]) > 1e-4


@pytest.mark.parametrize(
    "config", [SamplingConfig(temperature=0.8, top_k=3), SamplingConfig(temperature=1.3, top_p=0.7)]
)
def test_first_token_law_after_warpers(config):
    g = torch.Generator().manual_seed(7)
    p = logits_to_probs(2 * torch.randn(1, 3, V, dtype=torch.float64, generator=g), config)
    q = logits_to_probs(2 * torch.randn(1, 2, V, dtype=torch.float64, generator=g), config)
    counts = _first_token_law(speculative_verify, p, q, _sampled_drafts(q, 2), N, 7, 2)
    assert _chi2_pvalue(counts, p[0, 0]) > 1e-4  # also asserts nothing outside the filtered support


@pytest.mark.parametrize("broken", [always_accept, resample_from_target, residual_without_clamp])
def test_negative_controls_fail_the_first_token_test(broken):
    p, q = _random_pq(0, k=2)
    counts = _first_token_law(broken, p, q, _sampled_drafts(q, 2), 10_000, 0, 2)
    expected = p[0, 0] * counts.sum()
    outside = counts[expected == 0].sum() > 0
    assert outside or _chi2_pvalue(counts, p[0, 0]) < 1e-12


def test_negative_control_bonus_position_needs_the_bonus_law():
    # The bonus token appears after k accepted drafts; test its law conditioned on full acceptance.
    k = 2
    p, _ = _random_pq(3, k=k)
    q = p[:, :k].clone()  # everything accepted: the emitted token after the drafts is the bonus
    for verifier, ok in ((speculative_verify, True), (bonus_from_wrong_position, False)):
        g = torch.Generator().manual_seed(3)
        n = 10_000
        d = _sampled_drafts(q, k)(n, g)
        v = verifier(d, q.expand(n, k, V).contiguous(), p.expand(n, k + 1, V).contiguous(), g)
        assert (v.num_accepted == k).all()
        pval = _chi2_pvalue(torch.bincount(v.next_tokens, minlength=V).double(), p[0, k]) if ok else None
        if ok:
            assert pval > 1e-4
        else:
            counts = torch.bincount(v.next_tokens, minlength=V).double()
            exp = p[0, k] * n
            assert counts[exp == 0].sum() > 0 or chisquare(counts.numpy(), exp.numpy()).pvalue < 1e-12
