"""Lenient (lossy) verification: l = 1 is the lossless rule; l < 1 accepts more and is labelled lossy."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from quickdraft.cli import main
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.engine import Engine, EngineConfig
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers import LenientVerifier, lenient_verify, make_verifier, speculative_verify

from conftest import tiny_text_model

P = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
Q = torch.tensor([0.6, 0.1, 0.3], dtype=torch.float64)


def _one_step(verify, n: int, seed: int = 0) -> torch.Tensor:
    """n independent single-draft rounds: d ~ q, verify against p; returns the emitted first tokens."""
    g = torch.Generator().manual_seed(seed)
    d = torch.multinomial(Q.expand(n, 3), 1, replacement=True, generator=g)  # (n, 1)
    p = torch.stack([P, P]).expand(n, 2, 3)
    v = verify(d, Q.expand(n, 1, 3), p, g)
    return torch.where(v.num_accepted > 0, d[:, 0], v.next_tokens)


def _law(lenience: float) -> torch.Tensor:
    acc = torch.minimum(torch.ones(3, dtype=torch.float64), P / (lenience * Q))
    reject_mass = (Q * (1 - acc)).sum()
    r = (P - lenience * Q).clamp_min(0)
    return Q * acc + reject_mass * r / r.sum()


def test_lenience_one_is_exactly_the_lossless_rule():
    """The vectorised lenient rule at l = 1 and the tree rule on a path agree draw for draw (a batch
    of one consumes the stream the same way in both)."""
    d = torch.randint(0, 3, (300, 3), generator=torch.Generator().manual_seed(1))
    q = torch.softmax(torch.randn(300, 3, 3, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(300, 4, 3, dtype=torch.float64), -1)
    accepted = []
    for i in range(300):
        rows = (d[i : i + 1], q[i : i + 1], p[i : i + 1])
        a = lenient_verify(*rows, torch.Generator().manual_seed(i), 1.0)
        b = speculative_verify(*rows, torch.Generator().manual_seed(i))
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens), i
        accepted.append(int(a.num_accepted[0]))
    assert 0 < sum(accepted) < 3 * 300  # drafts were both accepted and rejected


def test_acceptance_probability_truth_table():
    # p(0)=0.2, q(0)=0.6: lossless accepts with 1/3, lenience 0.5 with 2/3, lenience 0.2 always
    n = 40_000
    d = torch.zeros((n, 1), dtype=torch.long)
    for lenience, expected in ((1.0, 1 / 3), (0.5, 2 / 3), (0.2, 1.0)):
        v = lenient_verify(d, Q.expand(n, 1, 3), P.expand(n, 2, 3), torch.Generator().manual_seed(0), lenience)
        rate = v.num_accepted.double().mean().item()
        assert abs(rate - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-9


def test_output_law_is_the_lenient_law_and_not_the_target_law():
    n = 40_000
    for lenience in (0.5, 0.25):
        out = _one_step(lambda d, q, p, g, lv=lenience: lenient_verify(d, q, p, g, lv), n)
        counts = torch.bincount(out, minlength=3).double()
        assert chisquare(counts.numpy(), (n * _law(lenience)).numpy()).pvalue > 1e-4
        # lossy: the emitted law is measurably not p (the lossless test would fail here)
        assert chisquare(counts.numpy(), (n * P).numpy()).pvalue < 1e-12
    m = 10_000  # the lossless rule runs row by row (the tree rule on paths): fewer rows, same test
    lossless = torch.bincount(_one_step(speculative_verify, m), minlength=3).double()
    assert chisquare(lossless.numpy(), (m * P).numpy()).pvalue > 1e-4


def test_deterministic_proposals_use_a_one_hot_q():
    n = 20_000
    d = torch.zeros((n, 1), dtype=torch.long)
    v = lenient_verify(d, None, P.expand(n, 2, 3), torch.Generator().manual_seed(0), 0.5)
    rate = v.num_accepted.double().mean().item()
    assert abs(rate - 0.4) < 0.02  # min(1, 0.2 / 0.5)


def test_lenient_is_named_labelled_and_refused_where_meaningless():
    v = make_verifier("lenient:0.3", SamplingConfig(temperature=1.0))
    assert isinstance(v, LenientVerifier) and v.lossy and v.name == "lenient:0.3"
    assert make_verifier("lenient", SamplingConfig(temperature=1.0)).lenience == 0.5
    for bad in ("lenient:0", "lenient:1.5", "lenient:x", "speculative:2"):
        with pytest.raises(QuickdraftError):
            make_verifier(bad, SamplingConfig(temperature=1.0))
    with pytest.raises(QuickdraftError, match="temperature 0"):
        make_verifier("lenient:0.5", SamplingConfig(temperature=0.0))


def test_engine_statistics_mark_lenient_runs_lossy():
    target = tiny_text_model()
    stop = StopConfig(20, target.eos_token_ids)
    ids = target.tokenizer("abc abc abc")["input_ids"]
    sampling = SamplingConfig(temperature=1.0, seed=3)
    lossy = Engine(target, EngineConfig(method="sd", drafter="truncated:1", verifier="lenient:0.5"))
    res = lossy.generate_ids(ids, sampling, stop)
    assert res.stats.lossy and res.stats.verifier == "lenient:0.5" and res.stats.num_draft_tokens > 0
    exact = Engine(target, EngineConfig(method="sd", drafter="truncated:1")).generate_ids(ids, sampling, stop)
    assert not exact.stats.lossy and exact.stats.verifier == "speculative"


def test_cli_labels_lossy_output(tiny_model_dir, capsys):
    rc = main(
        [
            "generate",
            "abc",
            "--target",
            tiny_model_dir,
            "--drafter",
            "truncated:1",
            "--verifier",
            "lenient:0.5",
            "--temperature",
            "0.8",
            "--seed",
            "1",
            "--max-new-tokens",
            "8",
            "--dtype",
            "float32",
        ]
    )
    assert rc == 0
    assert "LOSSY (lenient:0.5" in capsys.readouterr().out
    rc = main(["generate", "abc", "--target", tiny_model_dir, "--verifier", "lenient:0.5", "--dtype", "float32"])
    assert rc == 2
    assert "temperature 0" in capsys.readouterr().err
