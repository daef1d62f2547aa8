"""Trees that mix suffix and model branches (issue #24.3): greedy unions equal plain decoding in
float64, sampling rounds keep the target law (one source per round), and a union in sampling
rounds, the tempting shortcut, fails the law test (negative control)."""

from __future__ import annotations

import pytest
import torch
from test_distribution import _pair_pvalues
from test_suffix import sample_generations, walk_index
from test_tree import MarkovTree

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters import Drafter, ModelDrafter, make_drafter
from quickdraft.drafters.base import DraftRequest
from quickdraft.drafters.combined.mixed import MixedTreeDrafter, tree_paths
from quickdraft.drafters.model_free.suffix import SuffixDrafter
from quickdraft.drafters.model_free.suffix_index import SuffixIndex, concat_documents
from quickdraft.drafters.model_free.suffix_trie import merge_scores, paths_to_tree
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.choose import cached_model
from quickdraft.settings.options import options_from

from conftest import noisy_copy, random_transition, tiny_llama
from oracles import CONTROL_SHARE


def test_scored_model_trees_and_their_paths():
    target = tiny_llama(vocab=64, layers=2, seed=4, dtype=torch.float64)
    drafter = ModelDrafter(cached_model(target.model, 64))
    tree = drafter.propose([1, 2, 3], DraftRequest.tree(TreeShape(6, width=2)), SamplingConfig(), None)
    paths = tree_paths(tree)
    assert len(paths) == len(tree) == len(tree.scores)
    for path, score in paths.items():  # a path's draft probability never exceeds its parent's
        assert 0 < score <= 1 and (len(path) == 1 or score <= paths[path[:-1]] + 1e-12)


def test_union_keeps_both_sources():
    merged = paths_to_tree(merge_scores([{(5,): 0.9, (5, 6): 0.6}, {(7,): 0.8, (5,): 0.3, (5, 8): 0.2}], 4))
    assert sorted(zip(merged.tokens, merged.parents, strict=True)) == [(5, -1), (6, 0), (7, -1), (8, 0)]


def test_spec_and_refusals():
    assert parse_drafter_spec("mix")[0].kind == "mix"
    with pytest.raises(QuickdraftError):
        parse_drafter_spec("mix:ngram")
    with pytest.raises(QuickdraftError):
        MixedTreeDrafter(SuffixDrafter(None), type("NoTrees", (Drafter,), {})())


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=64, layers=3, seed=2, dtype=torch.float64)


@pytest.mark.parametrize("shape", [{"draft_tree": 8}, {"draft_tree": 0, "draft_length": 4}], ids=str)
def test_greedy_mixed_decoding_equals_plain_decoding_float64(target, shape):
    ar = Engine(target, options_from({"method": "ar"}))
    docs = [[1, 2] + ar.generate_ids([1, 2], SamplingConfig(), StopConfig(40)).token_ids]
    model = ModelDrafter(cached_model(noisy_copy(target, 0.3).model, 64))
    mixed = MixedTreeDrafter(SuffixDrafter(SuffixIndex(concat_documents(docs))), model)
    sd = Engine(target, options_from(shape), drafter=mixed)
    accepted = 0
    for prompt in ([1, 2, 5], [9, 9, 9, 9, 5, 9, 9], [3, 1, 4, 1, 5]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        assert b.token_ids == a.token_ids
        accepted += b.stats.num_accepted_draft_tokens
    assert accepted >= 10
    used = mixed.rounds_by_source
    assert used["union"] > 0 if shape["draft_tree"] else used["suffix"] + used["model"] > 0


def test_mix_builds_with_the_shipped_pieces_on_a_tiny_target(target):
    drafter = make_drafter("mix:truncated:1", target)
    assert isinstance(drafter, MixedTreeDrafter) and drafter.suffix.index is None  # no datastore ships for it


V = 6
N = 5000


def _mixed_samples(p, q, mixer_cls=MixedTreeDrafter, length=5, prompt=(0, 1, 2), n=N):
    mixed = mixer_cls(SuffixDrafter(walk_index(p, 600, 11)), ModelDrafter(MarkovTree(q)), min_match=5)
    out, nodes, _ = sample_generations(
        SpeculativeDecoder.tree(MarkovTree(p), mixed, TreeShape(5, width=2)), prompt, length, n
    )
    assert nodes > n
    return out, mixed.rounds_by_source


@pytest.mark.slow
def test_sampled_mixed_trees_have_the_target_law():
    p = random_transition(V, 13, concentration=0.5)
    q = 0.5 * p + 0.5 * random_transition(V, 14)
    samples, used = _mixed_samples(p, q)
    assert used["suffix"] > 0.1 * N and used["model"] > 0.1 * N  # both sources drafted rounds
    assert min(_pair_pvalues(samples, 2, p, 5)) > 1e-4 / 5


class UnionWhenSampling(MixedTreeDrafter):
    """Broken on purpose: the greedy union in sampling rounds, with the model's root q standing for
    every root child (the suffix children were never drawn from it)."""

    def propose(self, context, request, sampling, generator):
        scored, _ = self.suffix.scored(context, request.budget)
        tree = self.model.propose(context, request, sampling, generator)
        merged = paths_to_tree(merge_scores([scored, tree_paths(tree)], request.budget + 2))
        if -1 in tree.q_rows:
            merged.q_rows[-1] = tree.q_rows[-1]
        self.rounds_by_source["union"] += 1
        return merged


@pytest.mark.slow
def test_negative_control_union_in_sampling_rounds_fails():
    p = random_transition(V, 13, concentration=0.5)
    q = 0.5 * p + 0.5 * random_transition(V, 14)
    samples, _ = _mixed_samples(p, q, UnionWhenSampling, n=N // CONTROL_SHARE)
    assert min(_pair_pvalues(samples, 2, p, 5)) < 1e-8
