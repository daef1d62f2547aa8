"""Spec-Verification (issue #18): truth tables, beta = 1 equals greedy verification, the lossy label,
refusals, and SD with beta = 1 giving exactly plain decoding's tokens."""

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers import make_verifier
from quickdraft.verifiers.greedy import greedy_verify
from quickdraft.verifiers.specdec import spec_verify

from conftest import tiny_llama

GREEDY = SamplingConfig(temperature=0.0)


def logits_rows(*rows):
    """(1, n, V) from rows of log-probabilities given as lists."""
    return torch.tensor([rows], dtype=torch.float32)


# position rows over V = 4 tokens: log-probs (gaps to the top-1 are what tau reads)
ROW = [0.0, -0.5, -2.0, -5.0]  # ranks: 0, 1, 2, 3; gaps 0, 0.5, 2, 5


@pytest.mark.parametrize(
    "drafts, beta, tau, accepted, nxt",
    [
        ([0, 0], 1, 0.0, 2, 0),  # the top-1 always passes; bonus = argmax
        ([1, 0], 1, 9.0, 0, 0),  # beta 1: only the top-1, whatever tau
        ([1, 0], 2, 1.0, 2, 0),  # rank 2, gap 0.5 <= 1
        ([1, 0], 2, 0.4, 0, 0),  # rank 2 but gap 0.5 > 0.4
        ([2, 1], 3, 2.0, 2, 0),  # rank 3 gap 2 <= 2, then rank 2 gap 0.5
        ([2, 1], 2, 9.0, 0, 0),  # rank 3 is outside the top-2
        ([0, 3], 4, 4.9, 1, 0),  # gap 5 > 4.9: stops at the second draft, correction = argmax
    ],
)
def test_truth_table(drafts, beta, tau, accepted, nxt):
    v = spec_verify(torch.tensor([drafts]), logits_rows(ROW, ROW, ROW), beta, tau)
    assert int(v.num_accepted[0]) == accepted and int(v.next_tokens[0]) == nxt


def test_beta_one_is_greedy_verification():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(3, 5, 7, generator=g) * 3
        drafts = torch.where(
            torch.rand(3, 4, generator=g) < 0.6, logits[:, :4].argmax(-1), torch.randint(0, 7, (3, 4), generator=g)
        )
        a, b = spec_verify(drafts, logits, 1, 5.0), greedy_verify(drafts, logits)
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens)


def test_names_lossy_label_and_refusals():
    assert not make_verifier("specdec:beta=1", GREEDY).lossy
    lossy = make_verifier("specdec:beta=3,tau=1", GREEDY)
    assert lossy.lossy and lossy.name == "specdec:beta=3,tau=1"
    assert make_verifier("specdec", GREEDY).name == "specdec:beta=5,tau=3"
    for bad in ("specdec:beta=0", "specdec:tau=-1", "specdec:gamma=2", "specdec:beta=x"):
        with pytest.raises(QuickdraftError):
            make_verifier(bad, GREEDY)
    with pytest.raises(QuickdraftError, match="temperature 0"):
        make_verifier("specdec:beta=1", SamplingConfig(temperature=1.0))


def test_sd_with_beta_one_equals_plain_decoding_and_beta_five_is_labelled():
    target = tiny_llama(vocab=40, layers=3, hidden=32, seed=4, dtype=torch.float64, init=0.25)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    plain = Engine(target, EngineConfig(method="ar", dtype="float64")).generate_ids(prompt, GREEDY, StopConfig(40))
    cfg = EngineConfig(method="sd", drafter="truncated:1", dtype="float64", verifier="specdec:beta=1,tau=3")
    res = Engine(target, cfg).generate_ids(prompt, GREEDY, StopConfig(40))
    assert res.token_ids == plain.token_ids and res.stats.num_accepted_draft_tokens > 0
    cfg = EngineConfig(method="sd", drafter="truncated:1", dtype="float64", verifier="specdec:beta=5,tau=3")
    lossy = Engine(target, cfg).generate_ids(prompt, GREEDY, StopConfig(40))
    assert lossy.stats.lossy and lossy.stats.num_accepted_draft_tokens >= res.stats.num_accepted_draft_tokens
