"""Warper closed forms (testing.md A11) and the residual's edge cases (A8)."""

import math

import pytest
import torch

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import logits_to_probs, residual, sample


def test_temperature_closed_form():
    logits = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    probs = logits_to_probs(logits, SamplingConfig(temperature=2.0))
    expected = torch.softmax(logits / 2.0, -1)
    assert torch.allclose(probs, expected, atol=1e-12)


def test_greedy_is_one_hot_on_argmax():
    probs = logits_to_probs(torch.tensor([[0.5, 3.0, -1.0]]), SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_top_k_closed_form():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64))
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([0, 4 / 7, 0, 3 / 7], dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.35, [0, 1, 0, 0]),  # 0.4 alone reaches 0.35
        (0.5, [0, 4 / 7, 0, 3 / 7]),  # 0.4 < 0.5 -> add 0.3
        (0.75, [0, 4 / 9, 2 / 9, 3 / 9]),
        (1.0, [0.1, 0.4, 0.2, 0.3]),
    ],
)
def test_top_p_closed_form(top_p, expected):
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64))
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=top_p))
    assert torch.allclose(probs, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_probabilities_are_float32_for_bf16_logits():
    probs = logits_to_probs(torch.randn(3, 10).bfloat16(), SamplingConfig(temperature=0.7, top_p=0.9))
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(3))


def test_residual_closed_form_and_identity():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    accept = torch.clamp(p / q, max=1.0)
    assert torch.allclose(accept, torch.tensor([1.0, 1.0, 0.2], dtype=torch.float64))
    r = residual(p, q)
    assert torch.allclose(r, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    law = q * accept + (1 - (q * accept).sum()) * r
    assert torch.allclose(law, p, atol=1e-12)


def test_residual_falls_back_to_p_when_p_equals_q():
    p = torch.tensor([0.25, 0.75])
    r = residual(p, p.clone())
    assert not torch.isnan(r).any()
    assert torch.allclose(r, p)


def test_sample_respects_support():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5]).expand(1000, 4)
    draws = sample(probs, g)
    assert set(draws.tolist()) <= {1, 3}


def _law_pvalue(draws: torch.Tensor, law: torch.Tensor) -> float:
    from scipy.stats import chisquare

    counts = torch.bincount(draws, minlength=len(law)).double()
    assert counts[law == 0].sum() == 0  # a zero-probability id is never drawn
    keep = law > 0
    return float(chisquare(counts[keep].numpy(), (law[keep] * len(draws)).numpy()).pvalue)


def test_sample_has_each_rows_law_and_a_wrong_law_fails():
    law = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.15, 0.5, 0.0])  # zeros at both ends and inside
    other = torch.tensor([0.0, 0.1, 0.25, 0.0, 0.15, 0.5, 0.0])
    rows = torch.stack([law, other]).repeat(20_000, 1)  # (40000, 7): alternating rows, one draw each
    draws = sample(rows, torch.Generator().manual_seed(1))
    assert _law_pvalue(draws[0::2], law) > 1e-4 and _law_pvalue(draws[1::2], other) > 1e-4
    assert _law_pvalue(draws[1::2], law) < 1e-6  # negative control: the other row's draws fail this law
    unnormalised = sample((3 * law).expand(20_000, 7), torch.Generator().manual_seed(2))
    assert _law_pvalue(unnormalised, law) > 1e-4


@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize("r, expected", [(0.0, 5), (1.0 - 2.0**-53, 1)])
def test_sample_at_the_uniforms_extremes_stays_inside_the_support(monkeypatch, r, expected, one_row):
    law = torch.tensor([[0.0, 0.05, 0.3, 0.0, 0.15, 0.5, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full((1, 1), r, dtype=torch.float64))
    assert sample(law[0] if one_row else law, None).item() == expected


@pytest.mark.parametrize("vocab", [2, 7, 1000, 49152])
def test_one_row_draws_what_a_batch_of_one_draws(vocab):
    """A (V,) row takes the one-row path (u in Python's float64): the same token as the (1, V) batch from
    the same stream, zero-probability ids included."""
    for seed in range(100):
        p = torch.rand(vocab, generator=torch.Generator().manual_seed(seed)) ** 4
        if seed % 3 == 0:
            p[::2] = 0
        a = sample(p, torch.Generator().manual_seed(seed + 7))
        b = sample(p[None], torch.Generator().manual_seed(seed + 7))
        assert a.shape == () and b.shape == (1,) and a.item() == b.item()


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-0.1), dict(temperature=math.nan), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)],
)
def test_bad_sampling_config_is_rejected(kwargs):
    with pytest.raises(QuickdraftError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_greedy_is_the_first_argmax_in_every_dtype(dtype):
    """Half-precision rows are widened before the argmax: the same ids as the dtype's own argmax,
    the first of equal maxima (a verify's row and its plain step agree)."""
    from quickdraft.sampling import greedy

    torch.manual_seed(0)
    x = torch.randn(5, 151936).to(dtype)
    x[2, 7] = x[2, 900] = x[2].max() + 1  # a tie: the first one wins
    x[3, -1] = float("inf")
    assert torch.equal(greedy(x), x.argmax(-1))
    assert int(greedy(x)[2]) == 7 and int(greedy(x)[3]) == 151935
    assert greedy(x[0]).shape == ()
