"""PEARL with a fallback chain that mixes a deterministic stage and a sampled model stage (issue #23.7).

In a post-verify round the pending tokens come from one round's proposal and the new draft token
from the next one's, so a chain like `ngram+model` can judge model-sampled tokens (with q rows) and
n-gram copies (no q) together. Each token must keep its own q row (one-hot for a copy): dropping
the sampled rows, or handing one row to several tokens, breaks the target's law.
"""

from __future__ import annotations

import pytest
import torch
from test_distribution import _chains, _pair_pvalues

import quickdraft.decoding.pearl_logic as pearl_module
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Generators, collect
from quickdraft.decoding.pearl import PearlDecoder
from quickdraft.decoding.pearl_logic import PearlConfig, PearlLogic, PearlVerdict, stack_q_rows
from quickdraft.drafters import FallbackDrafter, ModelDrafter, PromptLookupDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.speculative import SpeculativeSampling

from conftest import MarkovModel
from oracles import CONTROL_SHARE, Named, always_accept

V = 6


def _row(*probs: float) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64)


def test_sampled_pending_then_deterministic_draft_keeps_each_row():
    logic = PearlLogic([0, 1], gamma=3)
    q = torch.stack([_row(0.1, 0.2, 0.3, 0.4, 0, 0), _row(0.5, 0.5, 0, 0, 0, 0), _row(0, 0, 0, 0, 0.5, 0.5)])
    logic.apply(PearlVerdict(1, -1), [3, 1, 5], q)  # pre round: 3 accepted, 1 and 5 pending with their rows
    assert logic.kind == "post" and logic.pending == [1, 5]
    cand, rows, bonus = logic.candidates([2, 4], None)  # this round's draft is an n-gram copy
    assert cand == [1, 5, 2] and not bonus
    assert torch.equal(rows[0], q[1]) and torch.equal(rows[1], q[2])  # the sampled rows survive
    assert torch.equal(rows[2], torch.nn.functional.one_hot(torch.tensor(2), V).double())  # the copy is one-hot


def test_deterministic_pending_then_sampled_draft_gets_one_row_per_token():
    logic = PearlLogic([0, 1], gamma=3)
    logic.apply(PearlVerdict(1, -1), [3, 1, 5], None)  # pre round of an n-gram copy: 1 and 5 pending, no q
    q_new = torch.stack([_row(0.2, 0.2, 0.2, 0.2, 0.1, 0.1), _row(1, 0, 0, 0, 0, 0)])
    cand, rows, _ = logic.candidates([4, 0], q_new)
    assert cand == [1, 5, 4] and rows.shape == (3, V)  # before the fix: one row for three tokens
    assert rows[0, 1] == 1 and rows[0].sum() == 1 and rows[1, 5] == 1 and rows[1].sum() == 1
    assert torch.equal(rows[2], q_new[0])


def test_all_deterministic_stays_none_and_verify_rounds_keep_rows():
    logic = PearlLogic([0, 1], gamma=2, post_verify=False)
    assert logic.candidates([4, 2], None)[1] is None
    logic.apply(PearlVerdict(1, -1), [4, 2], torch.stack([_row(0, 0, 0, 0, 1, 0), _row(0, 0, 0.5, 0.5, 0, 0)]))
    assert logic.kind == "verify" and logic.pending == [2]
    cand, rows, bonus = logic.candidates([], None)
    assert cand == [2] and bonus and torch.equal(rows[0], _row(0, 0, 0.5, 0.5, 0, 0))


def test_stack_q_rows_refuses_a_count_mismatch():
    with pytest.raises(QuickdraftError):
        stack_q_rows([1, 2], [None])


N = 6000
LENGTH = 6
PROMPT = [0, 1, 2, 0, 1]


def _mixed_chain_samples(verifier=None, gamma=2, n=N):
    """n generations through PEARL with ngram:2:2 + a model draft; returns samples, rounds per stage
    and how many judged batches mixed sampled and deterministic tokens."""
    p, q = _chains(5)
    drafter = FallbackDrafter([PromptLookupDrafter(max_ngram=2, min_ngram=2), ModelDrafter(MarkovModel(q))])
    mixed = 0
    real = pearl_module.stack_q_rows

    def counting(tokens, rows):
        nonlocal mixed
        kinds = {row is None for row in rows}
        mixed += len(kinds) == 2
        return real(tokens, rows)

    out = []
    pearl_module.stack_q_rows, saved = counting, pearl_module.stack_q_rows
    try:
        for i in range(n):
            dec = PearlDecoder(
                MarkovModel(p), drafter, verifier or SpeculativeSampling(), PearlConfig(gamma=gamma), gamma
            )
            res = collect(
                dec.rounds(PROMPT, SamplingConfig(temperature=1.0), LENGTH, Generators.from_seed(i)),
                StopConfig(max_new_tokens=LENGTH),
            )
            out.append(res.token_ids)
    finally:
        pearl_module.stack_q_rows = saved
    return p, out, drafter.rounds_by_drafter, mixed


@pytest.mark.slow
def test_pearl_with_an_ngram_then_model_chain_has_the_target_law():
    p, samples, (copy_rounds, model_rounds), mixed = _mixed_chain_samples()
    assert copy_rounds > 0.1 * N and model_rounds > 0.1 * N  # both stages really propose
    assert mixed > 0.1 * N  # and their tokens are judged together
    assert min(_pair_pvalues(samples, PROMPT[-1], p, LENGTH)) > 1e-4 / LENGTH


@pytest.mark.slow
def test_negative_control_the_old_defect_fails(monkeypatch):
    """The defect as it was: a mix of sampled and deterministic tokens judged as all one-hot."""

    def dropped(tokens, rows):
        return None if any(row is None for row in rows) else torch.stack(list(rows))

    monkeypatch.setattr(pearl_module, "stack_q_rows", dropped)
    p, samples, _, _ = _mixed_chain_samples()
    assert min(_pair_pvalues(samples, PROMPT[-1], p, LENGTH)) < 1e-6


@pytest.mark.slow
def test_negative_control_always_accept_fails():
    p, samples, _, _ = _mixed_chain_samples(Named(always_accept), n=N // CONTROL_SHARE)
    assert min(_pair_pvalues(samples, PROMPT[-1], p, LENGTH)) < 1e-12
