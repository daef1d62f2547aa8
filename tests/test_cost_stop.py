"""The "cost" chain schedule (`decoding.adaptive.CostStop`): a chain drafts on while one more token is
expected to raise the round's tokens per one-row step on the host's verify curve and draft step."""

from __future__ import annotations

import pytest
import torch

from quickdraft.config import DraftConfig
from quickdraft.costs.cost_curve import relative_cost
from quickdraft.decoding.adaptive import CostStop, make_draft_policy
from quickdraft.errors import QuickdraftError

FLAT = {1: 1.0, 2: 1.0, 3: 1.01, 5: 1.03, 9: 1.1, 17: 1.3, 33: 1.9}  # an AVX-512 host's kind of curve
STEEP = {1: 1.0, 2: 0.98, 3: 1.26, 5: 2.09, 9: 3.58, 17: 6.68, 33: 12.73}  # the AVX2 host's (stop 56)


def _priced(curve: dict[int, float], step: float):
    """A round's price: the verify curve at its rows plus `step` a drafted token (decoding/parts.round_cost's form)."""
    return lambda rows, nodes: relative_cost(curve, rows) + step * nodes


def _length(stop: CostStop, probs: list[float]) -> int:
    """The chain's length when its tokens come at these top-1 probabilities (the cap ends it)."""
    for depth, p in enumerate(probs, 1):
        if depth == stop.gamma or not stop.keep(p, depth):
            return depth
    return len(probs)


def test_a_flat_curve_drafts_long_chains_and_a_steep_one_short():
    sure = [0.99] * 16
    assert _length(CostStop(_priced(FLAT, 0.1), 8), sure) == 8
    assert 2 <= _length(CostStop(_priced(STEEP, 0.26), 8), sure) < 8  # the same drafts priced by AVX2's curve: short
    assert _length(CostStop(_priced(STEEP, 0.26), 8), [0.9] * 16) == 1  # a third of a step a row: one token pays best
    assert _length(CostStop(_priced(FLAT, 0.1), 8), [0.9] * 16) == 8


def test_an_unsure_draft_stops_and_a_costlier_draft_stops_sooner():
    assert _length(CostStop(_priced(FLAT, 0.1), 8), [0.95, 0.95, 0.05, 0.95, 0.95]) == 3
    cheap, dear = CostStop(_priced(FLAT, 0.02), 16), CostStop(_priced(FLAT, 0.6), 16)
    probs = [0.85] * 16
    assert _length(dear, probs) < _length(cheap, probs)


def test_each_chain_starts_afresh():
    stop = CostStop(_priced(STEEP, 0.26), 8)
    first = _length(stop, [0.99] * 8)
    _length(stop, [0.3] * 8)
    assert _length(stop, [0.99] * 8) == first  # depth 1 resets what the last chain accumulated


def test_it_reads_the_logits_top1_probability():
    stop = CostStop(_priced(FLAT, 0.1), 8)
    sure, unsure = torch.tensor([8.0, 0.0, 0.0]), torch.tensor([0.1, 0.0, 0.0])
    assert stop.keep_drafting(sure, 1) and not stop.keep_drafting(unsure, 1)


def test_the_cost_schedule_needs_the_hosts_costs():
    config = DraftConfig(num_draft_tokens=8, schedule="cost")
    assert isinstance(make_draft_policy(config, _priced(FLAT, 0.1)), CostStop)
    with pytest.raises(QuickdraftError, match="cost"):
        make_draft_policy(config)
