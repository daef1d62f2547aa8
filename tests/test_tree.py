"""Token trees: verification truth tables, the sibling rule's law (with negative controls that must
fail), whole generations on Markov chains, greedy equality with plain decoding, and a one-wide tree
reproducing chain speculative decoding token for token and count for count."""

import pytest
import torch
from scipy.stats import chisquare
from test_distribution import _pair_pvalues

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Generators, collect
from quickdraft.decoding import round as tree_decoding  # the one round loop verifies trees there
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters import ModelDrafter, PromptLookupDrafter
from quickdraft.drafters.tree import TreeShape, _draw_children, lookup_tree
from quickdraft.sampling import residual, sample
from quickdraft.settings.options import options_from
from quickdraft.verifiers.tree import TokenTree, verify_tree_sampling

from conftest import MarkovModel, random_transition, tiny_llama
from oracles import CONTROL_SHARE, verify_tree_greedy

V = 6


class MarkovTree(MarkovModel):
    """The Markov fake with the native runtime's tree verbs: a row's law depends only on its token,
    so positions and masks change nothing; compact keeps the chosen rows of the last extend."""

    supports_trees = True

    def extend(self, tokens, last_only=False, positions=None, tree_mask=None):
        self._block = self.length
        return super().extend(tokens, last_only)

    def compact(self, keep):
        rows = [self._block + i for i in keep]
        self.tokens[self._block :] = [self.tokens[r] for r in rows]


def _tree(tokens, parents):
    t = TokenTree()
    for tok, par in zip(tokens, parents, strict=True):
        t.add(tok, par)
    return t


# --- greedy truth table ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argmax, path, nxt",
    [
        ([1, 9, 9, 9, 9], [], 1),  # no child of the root matches
        ([3, 9, 9, 9, 9], [1], 9),  # second child matches, it has no children: bonus
        ([2, 5, 9, 9, 9], [0, 2], 9),  # root -> 2 -> 5 -> bonus from node 2's row
        ([2, 7, 9, 9, 9], [0], 7),  # root -> 2, no child 7
        ([2, 6, 9, 9, 4], [0, 3], 4),  # the other branch
    ],
)
def test_greedy_tree_truth_table(argmax, path, nxt):
    tree = _tree([2, 3, 5, 6], [-1, -1, 0, 0])
    rows = torch.nn.functional.one_hot(torch.tensor(argmax), 10).float()
    assert verify_tree_greedy(tree, rows) == (path, nxt)


def test_tree_mask_and_depths():
    tree = _tree([2, 3, 5, 6, 7], [-1, -1, 0, 0, 2])
    assert tree.depths == [1, 1, 2, 2, 3]
    m = tree.mask()
    assert m[5].tolist() == [True, True, False, True, False, True]  # node 4 sees root, 0, 2 and itself
    assert m[:, 0].all() and not m[2, 1]


# --- one step of the sibling rule: the emitted token has law p --------------------------------------


def _siblings_with_replacement(q, k, generator):
    return [int(sample(q, generator)) for _ in range(k)]


def _step_counts(p, q, k, n, draw="without", verify=verify_tree_sampling):
    g, counts = torch.Generator().manual_seed(0), torch.zeros(V)
    for _ in range(n):
        if draw == "without":
            kids, _ = _draw_children(q.log(), k, SamplingConfig(temperature=1.0), g)
        else:
            kids = _siblings_with_replacement(q, k, g)
        tree = _tree(kids, [-1] * len(kids))
        tree.q_rows[-1] = q
        rows = torch.cat([p[None], p.expand(len(kids), V)])
        path, nxt = verify(tree, rows, g)
        counts[kids[path[0]] if path else nxt] += 1
    return counts


def _no_residual_update(tree, p_rows, generator):
    """Broken: rejected siblings leave p as it was (the residual is never updated)."""
    u = torch.rand(len(tree), generator=generator, dtype=p_rows.dtype)
    p, q = p_rows[0], tree.q_rows[-1].clone()
    for c in range(len(tree)):
        x = tree.tokens[c]
        if u[c] < p[x] / q[x]:
            return [c], -1
        q[x] = 0
        q = q / q.sum()
    return [], int(sample(residual(p, tree.q_rows[-1]), generator))


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 4])
def test_sibling_rule_emits_the_target_law(k):
    p, q = random_transition(V, 1)[0], random_transition(V, 2)[0]
    counts = _step_counts(p, q, k, 12000)
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("case", ["with-replacement-verified-as-without", "no-residual-update"])
def test_sibling_rule_negative_controls_fail(case):
    p, q = random_transition(V, 1)[0], random_transition(V, 2)[0]
    n = 12000 // CONTROL_SHARE  # both fail by p < 1e-150 at 12000
    if case == "no-residual-update":
        counts = _step_counts(p, q, 3, n, verify=_no_residual_update)
    else:
        counts = _step_counts(p, q, 3, n, draw="with")
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue < 1e-6


# --- whole generations on Markov chains -------------------------------------------------------------

N = 5000


def _markov_tree_samples(p, q, shape, length, sampling, drafter="model", prompt=(0,)):
    d = ModelDrafter(MarkovTree(q)) if drafter == "model" else PromptLookupDrafter(max_ngram=2)
    decoder = SpeculativeDecoder.tree(MarkovTree(p), d, shape)
    out, nodes = [], 0
    for i in range(N):
        res = collect(decoder.rounds(list(prompt), sampling, length, Generators.from_seed(i)), StopConfig(length))
        out.append(res.token_ids)
        nodes += res.stats.num_draft_tokens
    assert nodes > 0  # trees were drafted
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shape", [TreeShape(6, width=2), TreeShape(8, widths=(3, 2))], ids=["dynamic", "static"])
def test_tree_decoding_has_the_target_law(shape):
    p = random_transition(V, 3)
    q = 0.5 * p + 0.5 * random_transition(V, 4)
    samples = _markov_tree_samples(p, q, shape, 5, SamplingConfig(temperature=1.0))
    assert min(_pair_pvalues(samples, 0, p, 5)) > 1e-4 / 5


@pytest.mark.slow
def test_lookup_trees_have_the_target_law():
    p = random_transition(V, 5)
    samples = _markov_tree_samples(
        p, p, TreeShape(6, width=3), 5, SamplingConfig(temperature=1.0), "ngram", prompt=(0, 1, 2, 0, 1, 3, 0, 1)
    )
    assert min(_pair_pvalues(samples, 1, p, 5)) > 1e-4 / 5


@pytest.mark.slow
def test_tree_decoding_negative_control_fails(monkeypatch):
    monkeypatch.setattr(tree_decoding, "verify_tree_sampling", _no_residual_update_tree)
    p = random_transition(V, 3)
    q = 0.5 * p + 0.5 * random_transition(V, 4)
    samples = _markov_tree_samples(p, q, TreeShape(6, width=2), 5, SamplingConfig(temperature=1.0))
    assert min(_pair_pvalues(samples, 0, p, 5)) < 1e-8


def _no_residual_update_tree(tree, p_rows, generator):
    """Broken whole-tree rule: after a rejected sibling, the next one is tested against p again."""
    u = torch.rand(len(tree), generator=generator, dtype=p_rows.dtype)
    kids = tree.children_map()
    node, path = -1, []
    while True:
        p, q = p_rows[node + 1], tree.q_rows.get(node)
        nxt = None
        for c in kids.get(node, []):
            if u[c] < p[tree.tokens[c]] / q[tree.tokens[c]]:
                nxt = c
                break
        if nxt is None:
            return path, int(sample(p, generator))
        path.append(nxt)
        node = nxt


# --- real tiny Llama: greedy equality, one-wide trees equal chains -----------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=64, layers=3, seed=2, dtype=torch.float64)


@pytest.mark.parametrize("drafter", ["truncated:1", "ngram", "ngram:2+truncated:1"])
@pytest.mark.parametrize("shape", [{"draft_tree": 10, "tree_width": 3}, {"draft_tree": 9, "tree_shape": "3,2"}])
def test_greedy_trees_equal_plain_decoding(target, drafter, shape):
    ar = Engine(target, options_from({"method": "ar"}))
    sd = Engine(target, options_from({"drafter": drafter, **shape}))
    drafted = 0
    for prompt in ([5, 6, 7], [9, 9, 9, 9, 5, 9, 9], [1, 2, 1, 2, 1]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        assert b.token_ids == a.token_ids
        drafted += b.stats.num_draft_tokens
        assert b.stats.extra.get("tree_nodes", 0) == b.stats.num_draft_tokens
    assert drafted > 0


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_k=20)])
@pytest.mark.parametrize("k", [1, 3])
def test_a_one_wide_tree_is_chain_speculative_decoding(target, sampling, k):
    # unguarded: the guard's verdict comes from this host's timings, and a round one engine pauses draws
    # other random numbers than a drafted round of the other (on the AVX2 host the two then diverged)
    chain = Engine(target, options_from({"drafter": "truncated:1", "draft_length": k, "guard": False}))
    tree = Engine(target, options_from({"drafter": "truncated:1", "draft_tree": k, "tree_width": 1, "guard": False}))
    for i, prompt in enumerate(([5, 6, 7], [9, 9, 9, 9], [3, 1, 4, 1, 5])):
        s = SamplingConfig(sampling.temperature, sampling.top_k, seed=i)
        a = chain.generate_ids(prompt, s, StopConfig(30))
        b = tree.generate_ids(prompt, s, StopConfig(30))
        assert b.token_ids == a.token_ids
        assert b.stats.accepted_lengths == a.stats.accepted_lengths
        assert (b.stats.num_draft_tokens, b.stats.num_accepted_draft_tokens) == (
            a.stats.num_draft_tokens,
            a.stats.num_accepted_draft_tokens,
        )
        assert b.stats.accepted_per_position == a.stats.accepted_per_position


def test_lookup_tree_merges_continuations_into_a_trie():
    context = [1, 2, 3, 1, 2, 4, 5, 1, 2, 3, 6, 1, 2]

    def leaves(tree):
        return {tuple(tree.tokens[i] for i in tree.path_to(n)) for n in range(len(tree)) if not tree.children(n)}

    # "1 2" recurs three times: the most recent continuations first, cut by the 8-node budget
    tree = lookup_tree(context, TreeShape(8, width=3))
    assert leaves(tree) == {(3, 6, 1, 2), (4, 5, 1, 2)} and len(tree) == 8
    # a larger budget: the third continuation (3 1 2 ...) shares its first token with the first one
    tree = lookup_tree(context, TreeShape(30, width=3))
    assert (3, 1, 2, 4, 5, 1, 2, 3, 6, 1, 2) in leaves(tree)
    assert sum(1 for i in tree.children(-1)) == 2  # 3 and 4: merged in a trie
    assert all(p < i for i, p in enumerate(tree.parents))


def test_trees_need_the_native_runtime(target):
    from quickdraft.errors import QuickdraftError

    with pytest.raises(QuickdraftError, match="native runtime"):
        Engine(target, options_from({"drafter": "ngram", "draft_tree": 4, "runtime": "hf"})).generate_ids(
            [1, 2, 3], SamplingConfig(), StopConfig(4)
        )


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_chain_is_a_one_wide_tree(deterministic):
    """The tree rules on a path are chain speculative sampling: the same accepted count and next
    token from the same random stream, for sampled and deterministic drafts; the path keeps the
    chain's q rows exactly (the one loop verifies chains with the chain verifier on them)."""
    from quickdraft.verifiers import speculative_verify

    V, k = 7, 4
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        p = torch.softmax(torch.randn(k + 1, V, generator=gen) * 2, -1).double()
        q = torch.softmax(torch.randn(k, V, generator=gen) * 2, -1).double()
        tokens = [int(sample(q[i], gen)) for i in range(k)]
        path = TokenTree.path(tokens, None if deterministic else q)
        assert path.parents == [-1, 0, 1, 2] and path.tensor().tolist() == tokens
        assert (path.path_q() is None) if deterministic else torch.equal(path.path_q(), q)
        chain = speculative_verify(
            path.tensor()[None], None if deterministic else q[None], p[None], torch.Generator().manual_seed(seed)
        )
        nodes, token = verify_tree_sampling(path, p, torch.Generator().manual_seed(seed))
        assert nodes == list(range(int(chain.num_accepted[0]))) and token == int(chain.next_tokens[0]), seed
