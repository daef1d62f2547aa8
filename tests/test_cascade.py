"""CS Drafting (issue #17): MaG, the k-matrix grammar, the recursive vertical/horizontal cascade with
stub drafters (quotas, reviews, lenience), greedy equality with plain decoding in float64, and the
target law under speculative sampling (the cascade's proposal is deterministic: q one-hot)."""

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.drafters import Drafter, ModelDrafter
from quickdraft.drafters.base import DraftRequest, draft_path
from quickdraft.drafters.combined.cascade import CascadeDrafter, check_k_matrix, parse_cascade
from quickdraft.drafters.model_free.mag import MaGDrafter, build_bigram, load_bigram, save_bigram
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.cached_model import CachedModel

from conftest import tiny_llama

V = 10


def rule(context):
    """The stubs' 'true' next token: (last + 1) mod V."""
    return (context[-1] + 1) % V


class StubReviewer(Drafter):
    """A reviewer whose greedy choice is `rule`, giving `side` probability to (last + 2) mod V."""

    can_review = True

    def __init__(self, name="R", side=0.0):
        self.name, self.side, self.reviews, self.seen = name, side, 0, []

    def begin(self, prompt_ids, budget=None):
        pass

    def step_seconds(self):
        return 1.0

    def _row(self, ctx):
        row = torch.full((V,), 1e-3)
        row[rule(ctx)] = 1.0 - self.side
        row[(ctx[-1] + 2) % V] = max(self.side, 1e-3)
        return row.log()

    def review(self, context, tokens):
        self.reviews += 1
        self.seen.append(list(tokens))
        ctx = list(context)
        rows = [self._row(ctx)]
        for t in tokens:
            ctx.append(t)
            rows.append(self._row(ctx))
        return torch.stack(rows)

    def propose(self, context, request, sampling, generator):
        ctx, out = list(context), []
        for _ in range(request.budget):
            out.append(rule(ctx))
            ctx.append(out[-1])
        return draft_path(out)


class StubBottom(Drafter):
    """A model-free bottom: right for `good` tokens, then (last + 2) mod V."""

    def __init__(self, good=2):
        self.name, self.good, self.calls = "bottom", good, 0

    def begin(self, prompt_ids, budget=None):
        pass

    def step_seconds(self):
        return None

    def propose(self, context, request, sampling, generator):
        self.calls += 1
        ctx, out = list(context), []
        for i in range(request.budget):
            out.append(rule(ctx) if i < self.good else (ctx[-1] + 2) % V)
            ctx.append(out[-1])
        return draft_path(out)


GREEDY = SamplingConfig(temperature=0.0)


def test_horizontal_quotas_and_vertical_reviews():
    reviewer, bottom = StubReviewer(), StubBottom(good=2)
    csd = CascadeDrafter([reviewer, bottom], [[3, 4], [4]])
    tokens = csd.propose([0], DraftRequest.chain(10), GREEDY, None).tokens
    # R fills 3 by reviewing 4-token bottom blocks (2 right + its own correction = 3 per review), then
    # the bottom extends by 4 (2 right, then off the rule)
    assert reviewer.reviews == 1 and reviewer.seen == [[1, 2, 4, 6]]
    assert tokens == [1, 2, 3, 4, 5, 7, 9]
    assert csd.calls == [1, 8]  # one review; the bottom drafted 4 tokens for it and 4 of its own
    assert len(csd.propose([0], DraftRequest.chain(2), GREEDY, None).tokens) == 2  # the decoder's k caps the block


def test_recursion_three_levels():
    top, mid, bottom = StubReviewer("A"), StubReviewer("B"), StubBottom(good=0)
    csd = CascadeDrafter([top, mid, bottom], [[2, 2, 2], [1, 3], [3]])
    tokens = csd.propose([5], DraftRequest.chain(6), GREEDY, None).tokens
    assert tokens[:4] == [6, 7, 8, 9]  # A and B levels are right by construction
    assert top.reviews >= 1 and mid.reviews >= 2  # B reviews for A (vertical) and for its own share
    assert all(len(s) <= 3 for s in mid.seen)  # B reviews blocks of the bottom's quota (row 2: 3)


def test_lenience_accepts_likely_tokens_only_inside():
    strict, lenient = StubReviewer(side=0.4), StubReviewer(side=0.4)
    bottom = StubBottom(good=0)  # proposes (last + 2): never R's argmax, R gives it 0.4
    a = CascadeDrafter([strict, bottom], [[3, 0], [3]], lenience=1).propose([0], DraftRequest.chain(3), GREEDY, None)
    b = CascadeDrafter([lenient, StubBottom(good=0)], [[3, 0], [3]], lenience=3).propose(
        [0], DraftRequest.chain(3), GREEDY, None
    )
    assert a.tokens == [1, 2, 3] and strict.reviews == 3  # strict: only R's own corrections
    assert b.tokens == [2, 4, 6] and lenient.reviews == 1  # 0.4 > 1/3: the bottom's tokens pass
    assert a.path_q() is None and b.path_q() is None  # deterministic: the top treats q as one-hot


def test_k_matrix_and_grammar():
    assert check_k_matrix([[2, 4]], 2) == [[2, 4], [0, 4]]
    assert check_k_matrix([[5, 14, 10], [1, 10], [10]], 3)[1] == [0, 1, 10]
    spec = parse_cascade("distilled>ngram:3:2>mag;k=1,2,4/2,4;l=2")
    assert [s.kind for s in spec.levels] == ["distilled", "ngram", "mag"] and spec.lenience == 2.0
    assert parse_cascade(None).levels[-1].kind == "mag"
    assert parse_drafter_spec("csd:truncated:1>mag")[0].kind == "csd"
    for bad in ("csd:mag", "csd:distilled>mag;k=1", "csd:distilled>mag;l=0.5", "csd:distilled>mag;x=1", "csd:a>mag"):
        with pytest.raises(QuickdraftError):
            parse_drafter_spec(bad)
    with pytest.raises(QuickdraftError, match="rows"):
        CascadeDrafter([StubReviewer(), StubBottom()], [[1, 1], [1], [1]])


def test_mag_lookup_then_bigram(tmp_path):
    table = build_bigram([[1, 2, 3, 1, 2, 4, 1, 2, 3]], 6)
    assert table.tolist() == [-1, 2, 3, 1, 1, -1]  # 2 -> 3 (twice) beats 2 -> 4; 5 never seen
    mag = MaGDrafter(load_bigram(save_bigram(table, tmp_path, {}), 6))
    assert mag.draft([0, 4, 0], 3) == [4, 0]  # suffix match: copy what followed (0 has no successor)
    assert mag.draft([5, 2], 4) == [3, 1, 2, 3]  # no match: the bigram chain from the last token
    assert mag.draft([5], 3) == []
    with pytest.raises(QuickdraftError, match="covers"):
        load_bigram(tmp_path, 7)


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(vocab=32, layers=3, hidden=32, seed=2, dtype=torch.float64, init=0.25)


@pytest.mark.parametrize("spec", ["csd:truncated:2>ngram", "csd:truncated:2>truncated:1>ngram;k=2,1,3/1,3;l=3"])
def test_greedy_equals_plain_decoding(tiny, spec):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    plain = Engine(tiny, EngineConfig(method="ar", dtype="float64")).generate_ids(prompt, GREEDY, StopConfig(60))
    engine = Engine(tiny, EngineConfig(method="sd", drafter=spec, dtype="float64"))
    res = engine.generate_ids(prompt, GREEDY, StopConfig(60))
    assert res.token_ids == plain.token_ids
    assert res.stats.num_accepted_draft_tokens > 0  # speculation happened


@pytest.mark.slow
@pytest.mark.parametrize("broken", [None, "always_accept", "resample_from_target"])
def test_sampling_has_the_target_law(broken):
    from test_real_distribution import Named, control_n, law_models, pvalue

    from quickdraft.verifiers.speculative import SpeculativeSampling

    import oracles

    models = law_models()
    target, draft = models
    bigram = build_bigram([[1, 4, 2, 0, 3, 5, 1, 2, 4, 0]], 6)
    cascade = CascadeDrafter([ModelDrafter(CachedModel(draft.model)), MaGDrafter(bigram)], [[1, 2], [2]], 2.0)
    parts = (CachedModel(target.model), cascade)
    if broken is None:
        p, rejected = pvalue(SpeculativeSampling(), models, parts)
        assert rejected > 0 and p > 1e-3
    else:
        assert pvalue(Named(getattr(oracles, broken)), models, parts, control_n(broken))[0] < 1e-3
