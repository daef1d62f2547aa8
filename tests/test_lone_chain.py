"""A lone greedy request on the static forward (`decoding/lone_chain.py`): a drafting engine first
chains PROBE plain steps (the step's time measured), then prices its drafted rounds by the clock
against that step; while the guard pauses, the plain rounds run chained. Greedy outputs equal plain
decoding exactly (float64) whatever the clock says, and a drafter that reads the target's features
never chains. Run on a CPU (the static shapes eagerly); CUDA captures the same steps."""

from __future__ import annotations

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.decoding.lone_chain import PROBE, LoneChain

from conftest import tiny_text_model

PROMPTS = ("abcabcabcab", "hello hello hello", "the cat sat on the mat, the cat")


@pytest.fixture(scope="module")
def target():
    return tiny_text_model(dtype=torch.float64)


def _run(target, monkeypatch, price: float | None, drafter: str = "suffix:none"):
    if price is not None:
        monkeypatch.setattr(LoneChain, "price", lambda self, static: price)
    plain = Engine(target, EngineConfig(method="ar", graphs="off"))
    lone = Engine(target, EngineConfig(drafter=drafter, graphs="on"))
    outs = []
    for prompt in PROMPTS:
        want = plain.generate(prompt, max_new_tokens=40)
        got = lone.generate(prompt, max_new_tokens=40)
        assert got.token_ids == want.token_ids
        outs.append(got)
    return lone.parts.memo["batch_decoder", 1], outs


def test_drafting_starts_with_a_measured_chained_probe(target, monkeypatch, flat_costs):
    decoder, outs = _run(target, monkeypatch, price=0.5)  # drafted rounds cheap: the guard never pauses
    static = decoder.target.static
    assert decoder.lone.step_s is not None and decoder.lone.step_s > 0
    assert static.chain_steps == PROBE  # once per engine: later requests draft from their first round
    assert sum(o.stats.num_accepted_draft_tokens for o in outs) > 0  # speculation happened
    assert sum(o.stats.extra.get("guard_pauses", 0) for o in outs) == 0


def test_a_paused_guard_runs_its_plain_rounds_chained(target, monkeypatch, flat_costs):
    decoder, outs = _run(target, monkeypatch, price=50.0)  # drafted rounds dear: the guard pauses
    static = decoder.target.static
    plain_rounds = sum(o.stats.extra.get("guard_plain_rounds", 0) for o in outs)
    assert sum(o.stats.extra.get("guard_pauses", 0) for o in outs) > 0 and plain_rounds > 0
    assert static.chain_steps >= PROBE + plain_rounds  # each plain round a chained step (the negative
    # control is the test above: cheap rounds, no pause, nothing chained after the probe)


def test_when_a_lone_row_chains(monkeypatch):
    """The decision's truth table: no static forward, a sampled row or QUICKDRAFT_CHAIN=0 never chain;
    no drafter always; a drafter that reads the target's features (the head) never, its features
    come with rounds; a guarded drafter chains its probe (no step measured yet) and its paused rounds."""
    from types import SimpleNamespace

    from quickdraft.config import SamplingConfig
    from quickdraft.decoding.guard import DraftGuard

    greedy, sampled = SamplingConfig(), SamplingConfig(temperature=1.0)
    lane = lambda sampling=greedy, reads=(): SimpleNamespace(sampling=sampling, reads=reads)  # noqa: E731
    guard, static, drafter, chain = DraftGuard(lambda rows, nodes: 1.0), object(), object(), LoneChain()
    assert not chain.chains(None, None, None, lane())
    assert not chain.chains(static, None, None, lane(sampled))
    assert chain.chains(static, None, None, lane())
    assert not chain.chains(static, drafter, guard, lane(reads=(-1,)))  # a feature reader
    assert not chain.chains(static, drafter, None, lane())  # unguarded: always drafts
    assert chain.chains(static, drafter, guard, lane())  # the probe
    chain.step_s = 1e-3
    assert not chain.chains(static, drafter, guard, lane())  # measured, not paused: drafts
    guard._plain_left = 3
    assert chain.chains(static, drafter, guard, lane()) and guard.paused()
    guard.take_plain(5)
    assert not guard.paused() and not chain.chains(static, drafter, guard, lane())
    monkeypatch.setenv("QUICKDRAFT_CHAIN", "0")
    assert not chain.chains(static, None, None, lane())
