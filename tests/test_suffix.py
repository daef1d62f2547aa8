"""Suffix drafting (issue #24): the index against naive search, the trie's scores, greedy equality
with plain decoding in float64 (chains and trees), the target law at T = 1 with negative controls,
the bounded cross-request cache, datastore files and the spec grammar."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_distribution import _pair_pvalues
from test_tree import MarkovTree

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Generators, collect
from quickdraft.decoding import round as tree_decoding  # the one round loop verifies trees there
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters import make_drafter
from quickdraft.drafters.base import DraftRequest
from quickdraft.drafters.model_free.datastore import load_datastore, save_datastore
from quickdraft.drafters.model_free.suffix import RecentOutputs, SuffixConfig, SuffixDrafter, parse_suffix
from quickdraft.drafters.model_free.suffix_index import SEP, SORTED_DEPTH, SuffixIndex, concat_documents
from quickdraft.drafters.model_free.suffix_trie import merge_scores, paths_to_tree, scan_matches, trie_scores
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.settings.options import options_from

from conftest import random_transition, tiny_llama
from oracles import CONTROL_SHARE

# --- the index against naive search -------------------------------------------------------------------


def _naive_longest(text: list[int], context: list[int], max_match: int) -> tuple[int, set[int]]:
    """(n, starts of the continuations): the longest suffix of context in text (no SEP inside)."""
    best, starts = 0, set()
    for n in range(1, min(max_match, len(context)) + 1):
        pat = context[-n:]
        found = {i + n for i in range(len(text) - n + 1) if text[i : i + n] == pat}
        if not found:
            break
        best, starts = n, found
    return best, starts


tokens_st = st.lists(st.integers(0, 3), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(docs=st.lists(tokens_st, min_size=1, max_size=4), context=st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_index_longest_match_equals_naive_search(docs, context):
    text = concat_documents(docs)
    index = SuffixIndex(text)
    n, lo, hi = index.longest_match(context, max_match=10)
    want_n, want_starts = _naive_longest(text.tolist(), context, 10)
    assert n == want_n
    starts = set((len(text) - index.order[lo:hi].astype(np.int64)).tolist()) if n else set()
    assert starts == want_starts
    rows = index.continuations(n, lo, hi, depth=3, max_rows=1000)
    assert rows.shape == (len(starts), 3)
    for start in starts:  # every continuation row is the text after an occurrence, cut at a SEP
        cont = text[start : start + 3].tolist()
        cut = cont[: cont.index(SEP)] if SEP in cont else cont
        assert any(r[: len(cut)].tolist() == cut and (len(cut) == 3 or r[len(cut)] == -1) for r in rows)


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=2, max_size=80), max_match=st.integers(1, 8))
def test_scan_matches_equals_naive_search_in_the_request_text(text, max_match):
    ids = np.asarray(text)
    n, rows = scan_matches(ids, text, len(text) - 1, max_match, depth=4, max_rows=1000)
    # naive: occurrences ending before the last token
    want_n, want_starts = _naive_longest(text[:-1], text, max_match)
    assert n == want_n
    assert len(rows) == len(want_starts)
    for row, start in zip(rows, sorted(want_starts), strict=True):
        cont = text[start : start + 4]
        assert row[: len(cont)].tolist() == cont and all(r == -1 for r in row[len(cont) :])


def test_matches_never_cross_documents_and_long_matches_are_capped():
    index = SuffixIndex(concat_documents([[1, 2, 3], [4, 5, 6, 7]]))
    assert index.longest_match([3, 4], 8)[0] == 1  # "3 4" spans a separator
    n, lo, hi = index.longest_match([2, 3], 8)
    assert n == 2 and index.continuations(n, lo, hi, 3, 10).tolist() == [[-1, -1, -1]]
    assert trie_scores(index.continuations(n, lo, hi, 3, 10), 4) == {}  # regression: a match at a document's end
    assert SuffixDrafter(index).candidates([9, 2, 3], 4) == []
    long = list(range(100))
    assert SuffixIndex(concat_documents([long + long])).longest_match(long, 100)[0] == SORTED_DEPTH


# --- trie scores and trees ----------------------------------------------------------------------------


def test_trie_scores_are_empirical_path_probabilities_and_prefix_closed():
    rows = np.array([[5, 6, 7], [5, 6, 8], [5, 9, -1], [4, -1, -1]])
    scores = trie_scores(rows, budget=10)
    assert scores[(5,)] == 0.75 and scores[(5, 6)] == 0.5 and scores[(5, 6, 7)] == 0.25 and scores[(4,)] == 0.25
    top3 = trie_scores(rows, budget=3)
    assert set(top3) == {(5,), (5, 6), (4,)}  # ties go to the shorter path
    for budget in range(1, 8):
        paths = trie_scores(rows, budget)
        assert all(p[:-1] in paths for p in paths if len(p) > 1)


def _naive_trie_scores(rows: np.ndarray, budget: int) -> dict[tuple[int, ...], float]:
    """Every prefix of every row counted one by one; best by (-score, length, path): ids past 255 too (the
    old ranking compared ids' bytes, so 256 came before 1 among equals)."""
    counts: dict[tuple[int, ...], int] = {}
    for row in rows.tolist():
        for d in range(1, len(row) + 1):
            if row[d - 1] < 0:
                break
            counts[tuple(row[:d])] = counts.get(tuple(row[:d]), 0) + 1
    ranked = sorted(counts, key=lambda path: (-counts[path], len(path), path))[:budget]
    return {path: counts[path] / len(rows) for path in ranked}


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.lists(st.sampled_from([0, 1, 255, 256, 65793]), min_size=4, max_size=4), min_size=1, max_size=30),
    ends=st.lists(st.integers(0, 4), min_size=30, max_size=30),
    budget=st.integers(1, 40),
)
def test_trie_scores_equal_counting_every_prefix(rows, ends, budget):
    table = np.array(rows, dtype=np.int64)
    for i, end in enumerate(ends[: len(rows)]):  # a row's text may stop early (-1 after it), even at once
        table[i, end:] = -1
    assert trie_scores(table, budget) == _naive_trie_scores(table, budget)


def test_merge_keeps_the_best_score_and_the_tree_is_parent_first():
    merged = merge_scores([{(1,): 0.5, (1, 2): 0.4}, {(3,): 0.9, (1,): 0.2}], budget=2)
    assert merged == [(3,), (1,)]
    tree = paths_to_tree(merge_scores([{(1,): 0.5, (1, 2): 0.4, (1, 2, 3): 0.1, (4,): 0.3}], 4))
    assert tree.tokens == [1, 4, 2, 3] and tree.parents == [-1, -1, 0, 2] and not tree.q_rows


def test_chain_is_the_greedy_path():
    store = SuffixIndex(concat_documents([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5]]))
    drafter = SuffixDrafter(store)
    proposal = drafter.propose([9, 1, 2], DraftRequest.chain(3), SamplingConfig(), None)
    assert proposal.tokens == [3, 4] and proposal.path_q() is None


def test_request_text_and_datastore_both_contribute():
    store = SuffixIndex(concat_documents([[1, 2, 9]]))
    drafter = SuffixDrafter(store)
    paths = drafter.candidates([1, 2, 3, 1, 2], budget=8)
    assert (3,) in paths and (9,) in paths  # "1 2" -> 3 from the request, -> 9 from the datastore
    assert SuffixDrafter(None).candidates([1, 2, 3, 1, 2], budget=4) == [(3,), (3, 1), (3, 1, 2)]


# --- the cross-request cache ---------------------------------------------------------------------------


def test_cross_request_cache_is_off_by_default_and_bounded():
    drafter = SuffixDrafter(None)
    drafter.begin([1])
    drafter.candidates([1, 2, 3, 4], 4)
    drafter.begin([1])
    assert drafter.recent.size == 0 and drafter.candidates([2, 3], 4) == []
    cached = SuffixDrafter(None, SuffixConfig(cache=50))
    cached.begin([1])
    cached.candidates([1, 2, 3, 4], 4)
    cached.begin([2])
    assert cached.candidates([2, 3], 4)[0] == (4,)  # the earlier request's text drafts


def test_cross_request_cache_memory_is_bounded_under_load():
    recent = RecentOutputs(max_tokens=1000)
    rng = np.random.default_rng(0)
    for _ in range(2000):  # many requests of up to 300 tokens
        recent.add(rng.integers(0, 500, int(rng.integers(1, 300))).tolist())
        assert recent.size <= 1000 and len(recent.text) == recent.size
    assert recent.text[-1] == SEP and len(recent.docs) >= 3


# --- losslessness --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=64, layers=3, seed=2, dtype=torch.float64)


def _own_text_index(target, prompts, n=60) -> SuffixIndex:
    """A datastore of the target's own greedy continuations (what build-datastore makes)."""
    ar = Engine(target, options_from({"method": "ar"}))
    docs = [list(p) + ar.generate_ids(list(p), SamplingConfig(), StopConfig(n)).token_ids for p in prompts]
    return SuffixIndex(concat_documents(docs))


TRAIN_PROMPTS = ([1, 2], [3, 3, 3], [8, 1, 8], [20, 21], [40], [11, 12, 13])
TEST_PROMPTS = ([1, 2, 5], [3, 3, 3, 4], [9, 9, 9, 9, 5, 9, 9], [40, 41])


@pytest.mark.parametrize("shape", [{"draft_length": 4}, {"draft_tree": 8}, {"draft_tree": 16}], ids=str)
def test_greedy_suffix_decoding_equals_plain_decoding_float64(target, shape):
    index = _own_text_index(target, TRAIN_PROMPTS)
    ar = Engine(target, options_from({"method": "ar"}))
    sd = Engine(target, options_from(shape), drafter=SuffixDrafter(index))
    drafted = accepted = 0
    for prompt in TEST_PROMPTS:
        a = ar.generate_ids(list(prompt), SamplingConfig(), StopConfig(48))
        b = sd.generate_ids(list(prompt), SamplingConfig(), StopConfig(48))
        assert b.token_ids == a.token_ids
        drafted += b.stats.num_draft_tokens
        accepted += b.stats.num_accepted_draft_tokens
    assert drafted > 0 and accepted >= 10  # speculation happened and drafts were accepted


def test_eos_and_max_tokens_edges(target):
    index = _own_text_index(target, TRAIN_PROMPTS)
    ar = Engine(target, options_from({"method": "ar"}))
    sd = Engine(target, options_from({"draft_tree": 8}), drafter=SuffixDrafter(index))
    prompt = [1, 2, 5]
    full = ar.generate_ids(prompt, SamplingConfig(), StopConfig(30)).token_ids
    eos = full[7]
    for stop in (StopConfig(1), StopConfig(5), StopConfig(30, eos_token_ids=(eos,))):
        assert (
            sd.generate_ids(prompt, SamplingConfig(), stop).token_ids
            == ar.generate_ids(prompt, SamplingConfig(), stop).token_ids
        )


V = 6
N = 5000


def walk_index(p: torch.Tensor, length: int, seed: int) -> SuffixIndex:
    """A datastore of the target chain's own text: one walk of `length` tokens from state 0."""
    rng = torch.Generator().manual_seed(seed)
    walk, x = [], 0
    for _ in range(length):
        x = int(torch.multinomial(p[x], 1, generator=rng))
        walk.append(x)
    return SuffixIndex(concat_documents([walk]))


def sample_generations(decoder, prompt, length: int, n: int = N) -> tuple[list[list[int]], int, int]:
    """(n generations at T = 1 with seeds 0..n-1, drafted nodes, accepted drafts)."""
    out, nodes, accepted = [], 0, 0
    for i in range(n):
        res = collect(
            decoder.rounds(list(prompt), SamplingConfig(temperature=1.0), length, Generators.from_seed(i)),
            StopConfig(length),
        )
        out.append(res.token_ids)
        nodes += res.stats.num_draft_tokens
        accepted += res.stats.num_accepted_draft_tokens
    return out, nodes, accepted


def _suffix_tree_samples(p, shape, length, prompt, seed_text=7, n=N):
    decoder = SpeculativeDecoder.tree(MarkovTree(p), SuffixDrafter(walk_index(p, 3000, seed_text)), shape)
    out, nodes, accepted = sample_generations(decoder, prompt, length, n)
    assert nodes > n and accepted > 0.1 * n  # trees were drafted and accepted
    return out


@pytest.mark.slow
def test_suffix_trees_have_the_target_law():
    p = random_transition(V, 9, concentration=0.5)
    samples = _suffix_tree_samples(p, TreeShape(6), 5, (0, 1, 2))
    assert min(_pair_pvalues(samples, 2, p, 5)) > 1e-4 / 5


@pytest.mark.slow
def test_suffix_tree_negative_control_fails(monkeypatch):
    def one_hot_as_certain(tree, p_rows, generator):  # accept the first sibling always: broken
        path, node = [], -1
        kids = tree.children_map()
        while kids.get(node):
            node = kids[node][0]
            path.append(node)
        return path, int(torch.multinomial(p_rows[node + 1], 1, generator=generator))

    def first_sibling(tree, best):  # the same break in the rule for drafts without q rows
        path, node = [], -1
        kids = tree.children_map()
        while kids.get(node):
            node = kids[node][0]
            path.append(node)
        return path, best[node + 1]

    monkeypatch.setattr(tree_decoding, "verify_tree_sampling", one_hot_as_certain)
    monkeypatch.setattr(tree_decoding, "follow_greedy", first_sibling)
    p = random_transition(V, 9, concentration=0.5)
    samples = _suffix_tree_samples(p, TreeShape(6), 5, (0, 1, 2), n=N // CONTROL_SHARE)
    assert min(_pair_pvalues(samples, 2, p, 5)) < 1e-8


# --- datastore files and the spec --------------------------------------------------------------------


def test_datastore_round_trip_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    tokens = concat_documents([[1, 2, 3, 4], [1, 2, 5], [70000, 1]])
    folder = save_datastore(tokens, tmp_path / "ds", {"vocab_size": 70001})
    index = load_datastore(folder, 70001, quiet=True)
    assert index.tokens.tolist() == tokens.tolist() and index.longest_match([1, 2], 4)[0] == 2
    assert load_datastore(folder, 70001, quiet=True).order.tolist() == index.order.tolist()  # from the cache
    with pytest.raises(QuickdraftError, match="vocabulary"):
        load_datastore(folder, 100, quiet=True)
    small = save_datastore(concat_documents([[1, 2]]), tmp_path / "small", {"vocab_size": 10})
    (small / "tokens.npy.xz").write_bytes((folder / "tokens.npy.xz").read_bytes())
    with pytest.raises(QuickdraftError, match="corrupt"):
        load_datastore(small, 70001, quiet=True)
    with pytest.raises(QuickdraftError, match="no suffix datastore"):
        load_datastore(tmp_path / "nothing")
    assert json.loads((folder / "datastore.json").read_text())["tokens"] == len(tokens)


def test_spec_grammar():
    assert parse_suffix(None) == (None, {})
    assert parse_suffix("/x;cache=100;match=8;depth=6") == ("/x", {"cache": 100, "max_match": 8, "depth": 6})
    assert parse_drafter_spec("suffix+ngram")[0].kind == "suffix"
    for bad in ("suffix:;cache=x", "suffix:;speed=3", "suffix:;depth=0", "suffix@float32"):
        with pytest.raises(QuickdraftError):
            parse_drafter_spec(bad)


def test_suffix_none_and_a_built_datastore_through_make_drafter(target, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    assert make_drafter("suffix:none", target).index is None
    folder = save_datastore(concat_documents([[1, 2, 3]]), tmp_path / "ds", {"vocab_size": 64})
    drafter = make_drafter(f"suffix:{folder};cache=64", target)
    assert drafter.index is not None and drafter.config.cache == 64 and drafter.name.startswith("suffix:")


def test_the_server_turns_the_cross_request_cache_on():
    from quickdraft.drafters.model_free.suffix import with_suffix_cache
    from quickdraft.server import SERVER_SUFFIX_CACHE, ServeConfig, engine_loader

    def cached(text: str, tokens: int) -> str:
        return "+".join(map(str, with_suffix_cache(parse_drafter_spec(text), tokens)))

    assert cached("suffix", 10) == "suffix:;cache=10"
    assert cached("ngram+suffix:/x;cache=5", 10) == "ngram+suffix:/x;cache=5"  # the user's choice wins
    assert cached("distilled", 10) == "distilled"
    assert parse_suffix(cached("suffix:/x", SERVER_SUFFIX_CACHE).split(":", 1)[1])[1] == {"cache": SERVER_SUFFIX_CACHE}
    assert callable(engine_loader(ServeConfig()))


def test_the_qwen_targets_own_output_datastore_ships_and_loads(tmp_path, monkeypatch):
    """The 1.5B's datastore (its greedy answers to SeqKD prompts, scripts/target_corpus.py) is found
    by the target's name alone, names that target, and loads over its 151,936-id vocabulary; a target
    with nothing shipped gets None (the request's own text only)."""
    from types import SimpleNamespace

    from quickdraft.drafters.model_free.datastore import META_FILE, shipped_datastore

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))  # the index is built in a fresh cache
    folder = shipped_datastore(SimpleNamespace(name="Qwen2.5-Coder-1.5B-Instruct"))
    assert folder is not None and folder.name == "qwen2.5-coder-1.5b-instruct"
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["target"] == "Qwen2.5-Coder-1.5B-Instruct" and meta["vocab_size"] == 151_936
    index = load_datastore(folder, 151_936)
    assert len(index.tokens) == meta["tokens"]
    assert shipped_datastore(SimpleNamespace(name="Qwen2.5-Coder-0.5B-Instruct")) is None
