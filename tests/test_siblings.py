"""A greedy chain with its draft's second choices beside it (`adaptive.CostStop.sibling`,
`model_drafter.with_siblings`): where a leaf pays on this host's curve, the verify holds the chain and the
leaves beside it, the tree rule follows the target's argmax, and the output stays plain decoding's."""

from __future__ import annotations

import pytest

from quickdraft import Engine
from quickdraft.config import SamplingConfig
from quickdraft.decoding.adaptive import CostStop
from quickdraft.decoding.round import chain_nodes
from quickdraft.drafters.draft_models.model_drafter import with_siblings
from quickdraft.settings.options import options_from
from quickdraft.verifiers.tree import follow_greedy

from conftest import tiny_text_model

FLAT = {1: 1.0, 2: 1.0, 3: 1.02, 5: 1.05, 9: 1.3}
STEEP = {1: 1.0, 2: 1.4, 3: 1.8, 5: 2.6, 9: 4.2}  # an AVX2-like curve: a row costs 0.4 steps


def _stop(curve: dict[int, float]) -> CostStop:
    from quickdraft.costs.cost_curve import relative_cost

    return CostStop(lambda rows, nodes: relative_cost(curve, rows) + 0.1 * nodes, 8)


def test_the_rule_follows_the_curve_and_the_chance_to_reach():
    flat, steep = _stop(FLAT), _stop(STEEP)
    assert flat.sibling(0.5, 0.3, 1, 2)  # a likely second choice at the first position: a row is nearly free
    assert not steep.sibling(0.5, 0.3, 1, 2)  # 0.4 steps a row: 0.3 tokens do not pay for it
    assert not flat.sibling(0.5, 0.001, 1, 2)  # an unlikely one does not, even here
    flat.keep(0.2, 1)  # the first draft is unsure: the second position is reached 1 time in 5
    assert not flat.sibling(0.5, 0.05, 2, 3)
    assert flat.sibling(0.5, 0.45, 2, 3)


def test_a_chain_with_leaves_beside_it():
    tree = with_siblings([10, 11, 12], [(1, 20), (3, 22)])
    assert tree.tokens == [10, 20, 11, 12, 22] and tree.parents == [-1, -1, 0, 2, 2]
    assert not tree.is_path() and chain_nodes(tree) == [0, 2, 3]
    # the target takes the leaf at position 1: its argmax at the root is 20, then 7 after it
    assert follow_greedy(tree, [20, 11, 7, 12, 13, 14]) == ([1], 7)
    assert follow_greedy(tree, [10, 11, 7, 22, 6, 8]) == ([0, 2, 4], 8)  # the chain, then the last leaf


@pytest.fixture
def disagreeing_draft(tmp_path):
    other = tiny_text_model(seed=1)  # a draft that often disagrees with the target: leaves get taken
    other.model.save_pretrained(tmp_path)
    other.tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.usefixtures("flat_costs")
@pytest.mark.parametrize("prompt", ["abc", "hello there", "zzz"])
def test_greedy_output_is_plain_decodings_and_leaves_are_taken(tiny_model_dir, disagreeing_draft, prompt):
    """In float64: equal to plain decoding with leaves beside the chains, some of them accepted; the control
    with `siblings=0` drafts plain chains (and gives the same text)."""
    plain = Engine.load(tiny_model_dir, options_from({"method": "ar"}), "float64").generate(prompt, max_new_tokens=40)
    got = {}
    for siblings in ("1", "0"):
        options = {"drafter": f"model:{disagreeing_draft}", "siblings": siblings, "guard": "0"}
        engine = Engine.load(tiny_model_dir, options_from(options), "float64")
        out = engine.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.token_ids and out.stats.num_draft_tokens > 0
        got[siblings] = out.stats.extra
    assert got["1"].get("sibling_nodes", 0) > 0
    assert "sibling_nodes" not in got["0"] and "sibling_hits" not in got["0"]


@pytest.mark.usefixtures("flat_costs")
def test_the_equality_can_fail(tiny_model_dir, disagreeing_draft, monkeypatch):
    """The negative control: a verify that lays the leaves out as a causal chain (each row seeing the
    leaf before it, at the next position) gives other text on some prompt."""
    from quickdraft.decoding import round as round_mod
    from quickdraft.runtime.caches.batched import RowBlock

    monkeypatch.setattr(round_mod, "block", lambda lane, draft, request: RowBlock([lane.context[-1], *draft.tokens]))
    options = {"drafter": f"model:{disagreeing_draft}", "guard": "0"}
    engine = Engine.load(tiny_model_dir, options_from(options), "float64")
    plain = Engine.load(tiny_model_dir, options_from({"method": "ar"}), "float64")
    prompts = ("abc", "hello there", "zzz", "qq")
    differs = [
        engine.generate(p, max_new_tokens=40).token_ids != plain.generate(p, max_new_tokens=40).token_ids
        for p in prompts
    ]
    assert any(differs)


@pytest.mark.usefixtures("flat_costs")
def test_some_leaf_is_accepted_over_prompts(tiny_model_dir, disagreeing_draft):
    """Across a few prompts the target takes a leaf at least once (speculation through a sibling happened)."""
    options = {"drafter": f"model:{disagreeing_draft}", "guard": "0"}
    engine = Engine.load(tiny_model_dir, options_from(options), "float64")
    hits = sum(engine.generate(p, max_new_tokens=40).stats.extra.get("sibling_hits", 0) for p in ("abc", "hello", "qq"))
    assert hits > 0


@pytest.mark.usefixtures("flat_costs")
def test_sampled_chains_and_other_schedules_draft_no_leaves(tiny_model_dir, disagreeing_draft):
    """Leaves are for greedy chains of the cost schedule: a sampled request and a fixed chain draft none."""
    base = {"drafter": f"model:{disagreeing_draft}", "guard": "0"}
    sampled = Engine.load(tiny_model_dir, options_from(base), "float64")
    out = sampled.generate("abc", max_new_tokens=24, temperature=0.9, seed=3)
    assert out.stats.num_draft_tokens > 0 and "sibling_nodes" not in out.stats.extra
    fixed = Engine.load(tiny_model_dir, options_from({**base, "draft_length": "4"}), "float64")
    out = fixed.generate("abc", max_new_tokens=24)
    assert out.stats.num_draft_tokens > 0 and "sibling_nodes" not in out.stats.extra
    assert fixed.method.build(fixed.parts, SamplingConfig()).make_policy().sibling is None


@pytest.mark.usefixtures("flat_costs")
def test_acceptance_by_position_counts_the_chain_not_its_leaves(tiny_model_dir, disagreeing_draft):
    """Leaves sit at their chain position's depth: positions drafted are the chains' lengths, so no position
    counts more drafts than rounds, and a round's leaves do not add positions past its chain."""
    options = {"drafter": f"model:{disagreeing_draft}", "guard": "0"}
    engine = Engine.load(tiny_model_dir, options_from(options), "float64")
    out = engine.generate("hello there", max_new_tokens=40)
    stats = out.stats
    assert stats.extra.get("sibling_nodes", 0) > 0
    assert stats.drafted_per_position[0] == stats.num_drafts
    assert sum(stats.drafted_per_position) == stats.num_draft_tokens - stats.extra["sibling_nodes"]
