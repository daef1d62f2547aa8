"""The one round loop (`decoding/round.py`): a lone request and a batch run the same step; the step's
parts checked on their own (draft ids outside the vocabulary, the solo target's commit)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Generators
from quickdraft.decoding.adaptive import TreeBudget
from quickdraft.decoding.common import StateHandoff
from quickdraft.decoding.round import Lane, RoundLoop, SoloTarget, block, is_prefix
from quickdraft.drafters.base import Drafter, DraftRequest
from quickdraft.drafters.tree import TreeShape
from quickdraft.runtime.caches.batched import RowBlock
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.verifiers.tree import TokenTree

from conftest import tiny_llama
from oracles import naive_greedy

SRC = Path(__file__).resolve().parents[1] / "src" / "quickdraft"
GREEDY = SamplingConfig()


def _names(path: Path) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)} | {
        a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom) for a in n.names
    }


def test_only_the_round_loop_applies_the_lossless_rules():
    """One round loop: the sequential and the batched decoders both call `RoundLoop.step`, and no
    decoder but it calls the tree rules itself; PEARL's state machine judges its chain with the same
    rules (verifiers/tree.py: its deterministic drafts through `follow_greedy`, the rest through the
    verifier objects), not a copy of them."""
    rules = {"follow_greedy", "verify_tree_sampling"}
    callers = sorted(str(p.relative_to(SRC)) for p in (SRC / "decoding").glob("*.py") if rules & _names(p))
    assert callers == ["decoding/pearl_logic.py", "decoding/round.py"]
    for loop in ("vanilla.py", "batch.py"):
        assert "RoundLoop" in _names(SRC / "decoding" / loop)


def test_within_vocab_drops_outside_ids_and_their_descendants():
    q = torch.eye(5)
    chain = TokenTree.path([1, 7, 2], q[:3], shallow=torch.arange(4.0)[:, None])
    cut = chain.within_vocab(5)
    assert cut.tokens == [1] and cut.parents == [-1] and torch.equal(cut.path_q(), q[:1])
    assert cut.shallow.flatten().tolist() == [0.0, 1.0]  # the root's and the kept node's rows
    tree = TokenTree([1, 9, 3, 4, 2], [-1, -1, 0, 1, 2], q_rows={-1: q[0], 0: q[1], 1: q[2]})
    kept = tree.within_vocab(5)
    assert kept.tokens == [1, 3, 2] and kept.parents == [-1, 0, 1]  # 9 and its child 4 are gone
    assert set(kept.q_rows) == {-1, 0} and torch.equal(kept.q_rows[0], q[1])
    assert chain.within_vocab(8) is chain  # nothing outside: the same tree


class _Scripted(Drafter):
    """Proposes fixed trees in turn (the test's drafts), whatever the context."""

    name = "scripted"
    drafts_trees = True

    def __init__(self, trees: list[TokenTree]) -> None:
        self.trees = trees

    def propose(self, context, request, sampling, generator):
        return self.trees.pop(0) if self.trees else TokenTree()


def test_a_solo_round_keeps_the_cache_on_the_committed_text_whatever_the_path():
    """Cache oracle: after rounds that accept a prefix (a rollback), a side branch (a compaction) and
    nothing, the target's cache holds exactly the committed text minus its last token, and the text
    is plain greedy decoding's."""
    loaded = tiny_llama(dtype=torch.float64, layers=2)
    prompt = [3, 1, 4, 1, 5]
    want = naive_greedy(loaded.model, prompt, 12)
    target = NativeCachedModel(loaded.model)
    # round 1: the right first token; round 2: a wrong first child, then the right one with a wrong
    # grandchild (a non-prefix path); round 3: a token outside the vocabulary (dropped, a plain step)
    trees = [
        TokenTree.path([want[1], (want[2] + 1) % 64]),
        TokenTree([(want[3] + 1) % 64, want[3], (want[4] + 1) % 64], [-1, -1, 1]),
        TokenTree.path([10_000]),
    ]
    loop = RoundLoop(SoloTarget(target, StateHandoff()), TreeBudget(TreeShape(3, width=2)))
    target.reset()
    first = int(target.extend(prompt, last_only=True)[-1].argmax())
    lane = Lane(prompt + [first], GREEDY, Generators.from_seed(0), _Scripted(trees), ())
    accepted = []
    for _ in range(4):
        (rnd,) = loop.step([lane], [8])
        accepted.append(rnd.num_accepted)
        assert target.tokens == lane.context[:-1]  # the one owner's cache: committed minus the last
    assert accepted == [1, 1, 0, 0]
    assert lane.context[len(prompt) :] == want[: len(lane.context) - len(prompt)]


def test_is_prefix():
    assert is_prefix([0]) and is_prefix([0, 1, 2]) and not is_prefix([0, 2]) and not is_prefix([1])


@pytest.mark.parametrize("drafter", ["ngram", "suffix:none"])
def test_a_lone_request_and_a_batch_of_one_give_the_same_rounds(drafter):
    """A lone request (the sequential decoder) and the same request alone in the batched decoder run
    the same step: the same tokens, drafts and acceptances round by round (float64)."""
    from quickdraft import Engine
    from quickdraft.settings.options import options_from

    loaded = tiny_llama(dtype=torch.float64)
    engine = Engine(loaded, options_from({"drafter": drafter, "draft_tree": 4, "guard": False}))
    prompt = [5, 9, 13, 2, 5, 9, 13, 2, 5]
    alone = engine.generate_ids(prompt, GREEDY, StopConfig(24))
    (batched,) = engine.generate_batch([prompt], GREEDY, StopConfig(24), max_batch=1)
    assert alone.token_ids == batched.token_ids == naive_greedy(loaded.model, prompt, 24)
    assert alone.stats.num_accepted_draft_tokens == batched.stats.num_accepted_draft_tokens > 0
    assert alone.stats.accepted_per_position == batched.stats.accepted_per_position


def test_row_blocks_of_a_chain_and_a_tree():
    lane = Lane([1, 2, 3], GREEDY, Generators.from_seed(0), None, ())
    chain = block(lane, TokenTree.path([4, 5]), None)
    assert chain == RowBlock([3, 4, 5]) and chain.depths is None
    tree = TokenTree([4, 5], [-1, -1])
    got = block(lane, tree, DraftRequest.tree(TreeShape(2, width=2)))
    assert got.tokens == [3, 4, 5] and got.depths == [0, 1, 1] and torch.equal(got.mask, tree.mask())


SEEDED = {
    "ngram chain": {"drafter": "ngram", "draft_tree": 0},
    "suffix trees": {"drafter": "suffix:none", "draft_tree": 4},
    "ngram chain, heuristic lengths": {"drafter": "ngram", "draft_schedule": "heuristic"},
    "pearl, ngram": {"method": "pearl", "drafter": "ngram"},
}


def _seeded_texts(options: dict, seeds=range(6), batched: bool = False) -> tuple[list[list[int]], int]:
    from quickdraft import Engine
    from quickdraft.settings.options import options_from

    loaded = tiny_llama(dtype=torch.float64, seed=4)
    engine = Engine(loaded, options_from({**options, "guard": False}))
    prompt = [5, 9, 13, 2, 5, 9, 13, 2, 5, 9]
    runs = [(SamplingConfig(temperature=0.9, seed=s), StopConfig(24)) for s in seeds]
    if batched:
        outs = [engine.generate_batch([prompt], sampling, stop, max_batch=1)[0] for sampling, stop in runs]
    else:
        outs = [engine.generate_ids(prompt, sampling, stop) for sampling, stop in runs]
    return [o.token_ids for o in outs], sum(o.stats.num_accepted_draft_tokens for o in outs)


@pytest.mark.parametrize("config", list(SEEDED))
def test_seeded_sampling_with_deterministic_drafts_gives_plain_decodings_text(config):
    """A token's draw is made from the seed and its output position alone, so speculation whose drafts
    carry no q rows (n-gram, suffix) gives, token for token, the text plain decoding samples with the
    same seed: chains, trees, adaptive lengths and PEARL, and a batched row too."""
    plain, _ = _seeded_texts({"method": "ar"})
    texts, accepted = _seeded_texts(SEEDED[config])
    assert texts == plain and accepted > 0  # drafts were accepted, and changed nothing
    assert len({tuple(t) for t in plain}) > 1  # the seeds sampled different texts
    if "pearl" not in config:
        assert _seeded_texts(SEEDED[config], seeds=range(3), batched=True)[0] == plain[:3]


def test_seeded_equality_fails_when_the_noise_is_not_keyed_by_position(monkeypatch):
    """Negative control: noise that also depends on how often its position was asked for (a draw
    made per evaluation, not per position: a rejected row's position is evaluated again next round)
    makes the speculative text differ from plain decoding's for the same seed."""
    from quickdraft.decoding.common import Generators

    def per_evaluation(self, position, vocab, device="cpu"):
        asked = self.__dict__.setdefault("asked", {})  # on the request's own draws (an id can be reused)
        k = asked[position] = asked.get(position, 0) + 1
        stream = torch.Generator(device=device).manual_seed(self.seed * 7919 + position * 104729 + k)
        return -torch.log(-torch.log(torch.rand(vocab, generator=stream, device=device)))

    monkeypatch.setattr(Generators, "noise", per_evaluation)
    plain, _ = _seeded_texts({"method": "ar"}, seeds=range(24))
    texts, accepted = _seeded_texts(SEEDED["ngram chain"], seeds=range(24))  # drafts are seldom accepted here
    assert accepted > 0 and texts != plain
