"""Drafters that reuse the target (issue #15): the feature head and Kangaroo.

- the native cache's shallow verbs equal a plain extend (float64) and roll back cleanly;
- both drafters, trained for a few steps on a tiny target's own greedy text (a one-batch overfit),
  give exactly plain decoding's tokens in float64 while accepting drafts; the cache after every
  round equals a fresh recompute;
- Kangaroo verifies with the remaining layers only, stops at eta, and a chain carries the states.
"""

import pytest
import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.drafters import FallbackDrafter, PromptLookupDrafter, ngram_drafter
from quickdraft.drafters.base import FEATURES
from quickdraft.drafters.draft_models.block import BlockDrafterRunner
from quickdraft.drafters.from_target.feature_head import FeatureHeadDrafter
from quickdraft.drafters.from_target.kangaroo import KangarooDrafter
from quickdraft.drafters.from_target.reuse import HeadLM
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.training.train_heads import Batch, HeadTrainingConfig, new_module, train_loss
from quickdraft.verifiers import make_verifier

from conftest import tiny_llama

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = SamplingConfig(temperature=0.0)


def run(decoder, n=48, sampling=GREEDY, seed=0):
    return collect(decoder.rounds(PROMPT, sampling, n, Generators.from_seed(seed)), StopConfig(n))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=48, layers=3, hidden=32, seed=5, dtype=torch.float64, init=0.25)


def plain(target, n=48):
    return run(Autoregressive(NativeCachedModel(target.model)), n).token_ids


def overfit(kind: str, target, steps: int = 150):
    """Train a module on the target's own greedy continuation of PROMPT (one batch, fixed)."""
    text = PROMPT + plain(target, 64)
    owner = NativeCachedModel(target.model)
    out = owner.forward(text, keep_hidden=(1,), features=True)
    batch = Batch(
        ids=torch.tensor([text]),
        lengths=[len(text)],
        prompt_lens=[len(PROMPT)],
        feats=out.features[None].clone(),
        shallow=out.hidden[1][None].clone(),
    )
    cfg = HeadTrainingConfig(kinds=(kind,), exit_layer=1, block=3)
    module = new_module(kind, target.model, cfg).double()
    embed, head = target.model.model.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    first = None
    for _ in range(steps):
        loss, stats = train_loss(module, batch, embed, head, 1.0)
        first = first or stats
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval().requires_grad_(False), first, stats, HeadLM(embed, head, 48, None)


@pytest.fixture(scope="module")
def trained(target):
    return {kind: overfit(kind, target, steps=400 if kind == "specdec" else 150) for kind in KINDS}


KINDS = ("head", "kangaroo", "specdec")
RUNNERS = {"head": FeatureHeadDrafter, "specdec": BlockDrafterRunner}


def make_drafter(kind, trained, eta=0.0):
    module, _, _, lm = trained[kind]
    return RUNNERS[kind](module, lm) if kind in RUNNERS else KangarooDrafter(module, lm, eta=eta)


def sd(target, drafter, k=4, sampling=GREEDY):
    verifier = make_verifier(None, sampling)
    policy = lambda: make_draft_policy(DraftConfig(k))  # noqa: E731
    return SpeculativeDecoder(NativeCachedModel(target.model), drafter, verifier, policy)


def test_one_batch_overfit_learns(trained):
    for kind, (_, first, last, _) in trained.items():
        assert last["ce"] < first["ce"] - 0.3 and last["agree"] > 0.7, (kind, first, last)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_plain_decoding_and_drafts_are_accepted(target, trained, kind):
    res = run(sd(target, make_drafter(kind, trained)))
    assert res.token_ids == plain(target)
    assert res.stats.num_accepted_draft_tokens > 0.3 * res.stats.num_draft_tokens > 0  # speculation happened


def test_kangaroo_shallow_extend_equals_a_full_extend(target):
    full, split = NativeCachedModel(target.model), NativeCachedModel(target.model)
    full.prefill(PROMPT)
    split.prefill(PROMPT)
    rows = [7, 8, 9]
    states = torch.cat([split.extend_shallow([t], 2) for t in rows])
    got = split.forward(rows, shallow=states, keep_hidden=(2,))
    want = full.forward(rows, keep_hidden=(2,))
    assert torch.allclose(got.logits, want.logits, atol=1e-10, rtol=0)
    assert torch.equal(got.hidden[2], states) and torch.allclose(want.hidden[2], states, atol=1e-10)
    assert torch.allclose(split.cache.k[:, :, : split.length], full.cache.k[:, :, : full.length], atol=1e-10)
    with pytest.raises(ValueError, match="not the ones"):
        split.extend([1], shallow=states[:1])


@pytest.mark.parametrize("kind", KINDS)
def test_cache_after_each_round_equals_a_recompute(target, trained, kind):
    decoder = sd(target, make_drafter(kind, trained))
    context = list(PROMPT)
    partial = full = 0
    for i, rnd in enumerate(decoder.rounds(PROMPT, GREEDY, 40, Generators.from_seed(0))):
        context += rnd.tokens
        if i == 0:
            continue
        partial += 0 < rnd.num_accepted < rnd.num_draft_tokens
        full += rnd.num_accepted == rnd.num_draft_tokens > 0
        fresh = NativeCachedModel(target.model)
        fresh.extend(context[:-1])
        owner = decoder.target
        assert owner.tokens == context[:-1]
        assert torch.allclose(owner.cache.k[:, :, : owner.length], fresh.cache.k[:, :, : fresh.length], atol=1e-10)
        if len(context) > 60:
            break
    assert full > 0  # both the all-accepted and the partial cases were checked
    assert partial + full > 1


def test_kangaroo_eta_stops_drafting(target, trained):
    res = run(sd(target, make_drafter("kangaroo", trained, eta=1.01), k=4))  # no draft is ever that sure
    assert res.stats.num_draft_tokens == res.stats.num_drafts > 0  # one token per round
    assert res.token_ids == plain(target)


@pytest.mark.parametrize("kind", KINDS)
def test_in_a_fallback_chain(target, trained, kind):
    chain = FallbackDrafter([ngram_drafter("3:2"), make_drafter(kind, trained)])
    res = run(sd(target, chain), n=60)
    assert res.token_ids == plain(target, 60)
    assert chain.rounds_by_drafter[1] > 0


def test_hf_runtime_is_refused(target, trained):
    decoder_args = (CachedModel(target.model), make_drafter("head", trained), make_verifier(None, GREEDY))
    with pytest.raises(QuickdraftError, match="native"):
        SpeculativeDecoder(*decoder_args, lambda: make_draft_policy(DraftConfig(2)))


def random_reusing(kind: str, target):
    """A module started from the target's layer and then scrambled, so q is far from p (the
    negative controls have power) yet overlaps it (both acceptance branches run)."""
    cfg = HeadTrainingConfig(kinds=(kind,), exit_layer=1)
    torch.manual_seed(0)
    module = new_module(kind, target.model, cfg).double().eval().requires_grad_(False)
    for param in module.parameters():
        param.add_(torch.randn_like(param) * 1.0)
    embed, head = target.model.model.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()
    lm = HeadLM(embed, head, target.model.config.vocab_size, None)
    return RUNNERS[kind](module, lm) if kind in RUNNERS else KangarooDrafter(module, lm, eta=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("broken", [None, "always_accept", "resample_from_target"])
def test_sampling_has_the_target_law(kind, broken):
    """Chi-square of whole 3-token generations at T=1 against the exact law (test_real_distribution);
    the broken verifiers are the negative controls and must fail the same test."""
    from test_real_distribution import Named, control_n, law_models, pvalue

    from quickdraft.verifiers.speculative import SpeculativeSampling

    import oracles

    models = law_models()
    target = models[0]
    parts = (NativeCachedModel(target.model), random_reusing(kind, target))
    if broken is None:
        p, rejected = pvalue(SpeculativeSampling(), models, parts)
        assert rejected > 0 and p > 1e-3
    else:
        assert pvalue(Named(getattr(oracles, broken)), models, parts, control_n(broken))[0] < 1e-3


@pytest.mark.parametrize("shape", [TreeShape(8, 3), TreeShape(12, 4, (3, 2, 1))])
def test_head_tree_greedy_equals_plain_decoding(target, trained, shape):
    decoder = SpeculativeDecoder.tree(NativeCachedModel(target.model), make_drafter("head", trained), shape)
    res = run(decoder)
    assert res.token_ids == plain(target)
    assert res.stats.num_accepted_draft_tokens > 0 and res.stats.extra["tree_nodes"] > 0


def test_kangaroo_has_no_trees(target, trained):
    with pytest.raises(QuickdraftError, match="cannot draft trees"):
        SpeculativeDecoder.tree(NativeCachedModel(target.model), make_drafter("kangaroo", trained), TreeShape(4, 2))


@pytest.mark.slow
def test_head_tree_sampling_has_the_target_law():
    """Whole 3-token generations drafted as head trees (q rows of the scrambled head) at T=1."""
    from scipy.stats import chisquare
    from test_real_distribution import LENGTH, SAMPLING, N, exact_law, law_models
    from test_real_distribution import PROMPT as LAW_PROMPT

    target = law_models()[0]
    decoder = SpeculativeDecoder.tree(NativeCachedModel(target.model), random_reusing("head", target), TreeShape(4, 2))
    counts: dict[tuple[int, ...], int] = {}
    rejected = 0
    for i in range(N):
        res = collect(decoder.rounds(LAW_PROMPT, SAMPLING, LENGTH, Generators.from_seed(i)), StopConfig(LENGTH))
        counts[tuple(res.token_ids)] = counts.get(tuple(res.token_ids), 0) + 1
        rejected += res.stats.num_draft_tokens - res.stats.num_accepted_draft_tokens
    law = exact_law(target.model)
    big = [s for s in sorted(law, key=law.get, reverse=True) if law[s] * N >= 5]
    observed = [counts.get(s, 0) for s in big] + [N - sum(counts.get(s, 0) for s in big)]
    expected = [law[s] * N for s in big] + [N * (1 - sum(law[s] for s in big))]
    assert rejected > 0 and len(big) >= 20
    assert chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_bench_counts_the_drafting_cost(target, trained, kind, tmp_path):
    """The bench's cost model (SWI) sees every reusing drafter's steps at a measured, non-zero cost
    (a Kangaroo drafter is only bound to the target by its first generation)."""
    from quickdraft.bench.methods import QuickdraftMethod, parse_methods
    from quickdraft.training.train_draft_cli import export

    module, _, _, _ = trained[kind]
    folder = export(tmp_path / kind, module, None, {"target": target.name})
    method = QuickdraftMethod(parse_methods(f"sd:drafter={kind}:{folder},draft_length=3")[0], target, "float64")
    first, second = method.run(PROMPT, 12), method.run(PROMPT, 12)
    assert method.costs and method.costs[0] > 0
    assert first.draft_cost_units > 0 and second.draft_cost_units > 0
    assert second.token_ids == plain(target, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_reusing_drafters_run_in_the_batched_engine(target, trained, kind, tmp_path):
    """The head and SpecDec forked per row, each fed its row's target features; Kangaroo forked with
    a private copy of the target's first layers: a batch of prompts gives each one's plain output."""
    from quickdraft import Engine, EngineConfig
    from quickdraft.training.train_draft_cli import export

    folder = export(tmp_path / kind, trained[kind][0], None, {"target": target.name})
    engine = Engine(target, EngineConfig(drafter=f"{kind}:{folder}", dtype="float64"))
    assert engine.batch_unsupported() is None
    prompts = [PROMPT, PROMPT[3:] + [7, 7], [5, 9, 2, 6, 5, 3], PROMPT + [1, 1, 2]]
    together = engine.generate(prompts, max_new_tokens=32)
    for prompt, res in zip(prompts, together, strict=True):
        alone = Autoregressive(NativeCachedModel(target.model)).rounds(prompt, GREEDY, 32, Generators.from_seed(0))
        assert res.token_ids == collect(alone, StopConfig(32)).token_ids and res.stats.extra.get("batch_rows")
    assert sum(r.stats.num_accepted_draft_tokens for r in together) > 0  # speculation happened


class Spy(PromptLookupDrafter):
    """Prompt lookup that declares it reads the target's features and layer 1, and keeps what the
    decoder hands it (it must be exactly the committed rows, in order)."""

    target_layers = (FEATURES, 1)

    def __init__(self) -> None:
        super().__init__(max_ngram=2)
        self.seen: dict[int, list[torch.Tensor]] = {FEATURES: [], 1: []}

    def observe(self, states):
        for layer, rows in states.items():
            self.seen[layer].extend(rows)


@pytest.mark.parametrize("tree", [0, 6])
def test_the_decoder_hands_over_exactly_the_committed_rows(target, tree):
    """The target's states reach the drafter only as the argument of `observe`: after a generation
    the drafter has seen, for every committed token but the last, the rows a fresh forward over the
    whole sequence gives (chains: a prefix of each forward's rows; trees: the root and accepted path)."""
    spy = Spy()
    owner = NativeCachedModel(target.model)
    if tree:
        decoder = SpeculativeDecoder.tree(owner, spy, TreeShape(tree, width=2))
    else:
        decoder = SpeculativeDecoder(owner, spy, make_verifier(None, GREEDY), lambda: make_draft_policy(DraftConfig(4)))
    out = run(decoder, 40)
    assert out.stats.num_accepted_draft_tokens > 0  # speculation happened, so rows were picked from wider forwards
    sequence = PROMPT + out.token_ids
    whole = NativeCachedModel(target.model).forward(sequence[:-1], keep_hidden=(1,), features=True)
    assert len(spy.seen[FEATURES]) == len(sequence) - 1 == len(spy.seen[1])
    assert torch.allclose(torch.stack(spy.seen[FEATURES]), whole.features, atol=1e-10)
    assert torch.allclose(torch.stack(spy.seen[1]), whole.hidden[1], atol=1e-10)


def test_no_drafter_holds_the_targets_cache_owner(target, trained):
    """Kangaroo drafts with the target's own first layers over the target's cache, through a handle
    on exactly those layers (ShallowPass), never the cache owner itself."""
    from quickdraft.runtime.caches.native_cache import ShallowPass

    for kind in ("head", "kangaroo", "specdec"):
        drafter = make_drafter(kind, trained)
        decoder = sd(target, drafter)
        out = run(decoder, 24)
        assert out.token_ids == plain(target, 24) and out.stats.num_draft_tokens > 0
        held = [v for v in vars(drafter).values() if isinstance(v, NativeCachedModel)]
        assert not held, kind
        if kind == "kangaroo":
            assert isinstance(drafter.shallow, ShallowPass) and drafter.shallow.stop == drafter.exit_layer
    with pytest.raises(ValueError, match="exit layer"):
        NativeCachedModel(target.model).shallow_pass(3)  # the last layer is no early exit


def test_a_heads_measured_gain_table_sizes_its_tree(target, trained, tmp_path, monkeypatch):
    """`draft_tree` auto with a trained head whose folder carries `tree_gain` (and the width each
    budget was measured at): the budget maximises tokens per second with the head's own forwards
    counted (a cheap head: the big tree; a costlier one whose table says width 2: the smaller tree,
    at width 2; one as dear as the target: no speculation); the output stays plain decoding's."""
    from quickdraft import Engine
    from quickdraft.costs import cost_curve
    from quickdraft.decoding import parts as parts_module
    from quickdraft.drafters import tree as tree_module
    from quickdraft.settings.options import options_from
    from quickdraft.training.train_draft_cli import export

    gain = {"1": 1.5, "4": 2.0, "8": 2.2}
    wide = export(tmp_path / "wide", trained["head"][0], None, {"target": target.name, "tree_gain": gain})
    narrow = export(
        tmp_path / "narrow",
        trained["head"][0],
        None,
        {"target": target.name, "tree_gain": gain, "tree_gain_width": {"4": 2, "8": 2}},
    )
    flat = {1: 1.0, 2: 1.0, 5: 1.05, 9: 1.1, 17: 1.5}
    monkeypatch.setattr(parts_module, "step_seconds", lambda model: 1.0)  # draft steps in target steps
    shapes = []
    real_shape = tree_module.TreeShape
    monkeypatch.setattr(tree_module, "TreeShape", lambda *a: shapes.append(real_shape(*a)) or shapes[-1])
    for folder, ratio, want, width in ((wide, 0.01, 8, 8), (narrow, 0.2, 4, 2), (wide, 1.5, 0, None)):
        monkeypatch.setattr(cost_curve, "_MEMO", {cost_curve.host_key(target.name, "bfloat16"): flat})
        monkeypatch.setattr(parts_module, "drafter_step_seconds", lambda drafter, r=ratio: r)
        engine = Engine(target, options_from({"method": "sd", "drafter": f"head:{folder}"}))
        assert engine.drafter.tree_gain == {1: 1.5, 4: 2.0, 8: 2.2}
        out = engine.generate_ids(PROMPT, GREEDY, StopConfig(24))
        assert out.token_ids == plain(target, 24)
        if want:
            assert out.stats.extra["tree_budget_auto"] == want and out.stats.num_accepted_draft_tokens > 0
            assert (shapes[-1].budget, shapes[-1].width) == (want, width)
        else:
            assert out.stats.extra == {"tree_auto_no_speculation": 1} and out.stats.num_draft_tokens == 0


def test_a_head_without_a_gain_table_keeps_chains(target, trained, tmp_path):
    from quickdraft import Engine
    from quickdraft.settings.options import options_from
    from quickdraft.training.train_draft_cli import export

    folder = export(tmp_path / "head", trained["head"][0], None, {"target": target.name})
    engine = Engine(target, options_from({"method": "sd", "drafter": f"head:{folder}"}))
    out = engine.generate_ids(PROMPT, GREEDY, StopConfig(24))
    assert engine.drafter.tree_gain is None and "tree_rounds" not in out.stats.extra
    assert out.stats.num_accepted_draft_tokens > 0 and out.token_ids == plain(target, 24)
