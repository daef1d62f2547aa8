"""The next round drafted while the verify runs (`decoding/ahead.py`, issue #70 item 2): the pure
rules (which outcome is guessed, when the draft made for it is kept, what is kept), and the round
loop over emulated graphs (`runtime/forward/capture.py`) giving plain decoding's tokens in float64,
greedy and seeded, with drafts made ahead and kept (and a control where the switch is off)."""

from __future__ import annotations

import functools

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding.ahead import Ahead, branches, deeper, first_path, guess, subtree, take_ahead
from quickdraft.drafters.base import DraftRequest
from quickdraft.drafters.model_free.suffix import SuffixDrafter
from quickdraft.drafters.tree import TreeShape
from quickdraft.runtime.forward.graphs import StaticBatchForward
from quickdraft.verifiers.tree import TokenTree

from conftest import tiny_llama

CHAIN = DraftRequest.chain(3)
TREE = DraftRequest.tree(TreeShape(4, 2))


def _tree() -> TokenTree:
    """root -> 5 (-> 6 -> 7, -> 8), root -> 9 (-> 10)."""
    t = TokenTree()
    a = t.add(5, -1)
    b = t.add(9, -1)
    c = t.add(6, a)
    t.add(8, a)
    t.add(10, b)
    t.add(7, c)
    return t


def test_the_guess_follows_first_children():
    t = _tree()
    assert first_path(t) == [0, 2, 5] and guess([1, 2], t) == [1, 2, 5, 6, 7]
    assert first_path(TokenTree()) == [] and guess([1], TokenTree()) == [1]
    assert branches(t) == [[0, 2, 5], [0, 3], [1, 4]] and branches(t, 1) == [[0, 2, 5]]  # whole branches only
    assert guess([1], t, [1, 4]) == [1, 9, 10]
    assert deeper(CHAIN) == DraftRequest.chain(4) and deeper(TREE).shape.budget == 5 == deeper(TREE).budget


def test_the_subtree_below_the_bonus_token():
    t = _tree()
    below = subtree(t, 5, TREE)
    assert below.tokens == [6, 8, 7] and below.parents == [-1, -1, 0]
    assert subtree(t, 5, CHAIN).tokens == [6, 7]  # a chain request: first children only
    assert subtree(t, 5, DraftRequest.tree(TreeShape(2, 2))).tokens == [6, 8]  # cut to the budget
    assert subtree(t, 9, TREE).tokens == [10]
    assert subtree(t, 4, TREE) is None  # the bonus is not among the first nodes
    assert subtree(t, 10, TREE) is None  # not a root child


def test_a_draft_ahead_is_kept_only_where_its_guess_held():
    ahead = [Ahead([1, 2, 9, 10], TokenTree.path([6])), Ahead([1, 2, 5, 6, 7], TokenTree.path([3, 4, 8]))]
    assert take_ahead(ahead, [1, 2, 5, 6, 7, 3], CHAIN).tokens == [4, 8]
    assert take_ahead(ahead, [1, 2, 9, 10, 6], CHAIN) is None  # nothing below the bonus token
    assert take_ahead(ahead, [1, 2, 5, 6, 7, 4], CHAIN) is None  # another bonus token
    assert take_ahead(ahead, [1, 2, 5, 6, 3], CHAIN) is None  # fewer accepted
    assert take_ahead(ahead, [1, 2, 8, 6, 7, 3], CHAIN) is None  # another context
    assert take_ahead(ahead, [1, 2, 5, 6, 7, 3], None) is None  # a plain round
    assert take_ahead([], [1, 2, 5, 6, 7, 3], CHAIN) is None


def test_drafters_that_draft_ahead_are_host_lookups():
    """Only drafters whose fork's draft is a function of its context and shared data draft ahead: the
    suffix and prompt-lookup ones; a model drafter (its own cache, its draws) does not."""
    from quickdraft.drafters.draft_models.model_drafter import ModelDrafter
    from quickdraft.drafters.model_free.ngram import PromptLookupDrafter

    assert SuffixDrafter.drafts_ahead and PromptLookupDrafter.drafts_ahead and not ModelDrafter.drafts_ahead
    drafter = SuffixDrafter(None)
    twin = drafter.fork()
    drafter.begin([1, 2, 3, 1, 2])
    drafter.propose([1, 2, 3, 1, 2], CHAIN, SamplingConfig(), None)
    twin.propose([1, 2, 3, 1, 2, 3, 1], CHAIN, SamplingConfig(), None)  # a guess, by the twin
    assert drafter.last_context == [1, 2, 3, 1, 2]  # the lane's drafter is untouched


PROMPT = [(5 * i) % 11 + 3 for i in range(60)] + [31] * 8  # the tiny model's own loop: whole drafts accepted


def _engines(monkeypatch, drafter: str):
    monkeypatch.setattr("quickdraft.engine.StaticBatchForward", functools.partial(StaticBatchForward, emulate=True))
    model = lambda: tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64)  # noqa: E731
    plain = Engine(model(), EngineConfig(method="ar", graphs="off", device="cpu"))
    return plain, Engine(
        model(), EngineConfig(method="sd", drafter=drafter, graphs="on", device="cpu", draft=DraftConfig(guard=False))
    )


@pytest.mark.parametrize("drafter", ["suffix:none", "ngram"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.2, seed=4)])
def test_rounds_drafted_ahead_give_plain_decodings_tokens(monkeypatch, drafter, sampling):
    plain, engine = _engines(monkeypatch, drafter)
    want = plain.generate_ids(PROMPT, sampling, StopConfig(48))
    got = engine.generate_ids(PROMPT, sampling, StopConfig(48))
    assert got.token_ids == want.token_ids
    extra = got.stats.extra
    assert got.stats.num_accepted_draft_tokens > 0  # speculation happened
    assert extra.get("ahead_drafts", 0) > 0 and extra.get("ahead_hits", 0) > 0  # drafted ahead, and kept


def test_the_switch_off_drafts_nothing_ahead(monkeypatch):
    """Control: QUICKDRAFT_AHEAD=0 gives the same tokens with no draft made ahead."""
    monkeypatch.setenv("QUICKDRAFT_AHEAD", "0")
    plain, engine = _engines(monkeypatch, "suffix:none")
    got = engine.generate_ids(PROMPT, SamplingConfig(), StopConfig(48))
    assert got.token_ids == plain.generate_ids(PROMPT, SamplingConfig(), StopConfig(48)).token_ids
    assert got.stats.num_accepted_draft_tokens > 0 and "ahead_drafts" not in got.stats.extra
