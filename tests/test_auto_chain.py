"""An independent draft model's default chain (`Drafter.pmin`): up to 8 tokens, stopped where one more
is not expected to pay on this host's costs (the "cost" schedule; llama.cpp's p-min, stopped after a
token the draft gives p < 0.7, where the target has no curve); any draft option given keeps the chain
asked for."""

from __future__ import annotations

import pytest

from quickdraft import Engine
from quickdraft.costs.cost_curve import relative_cost
from quickdraft.decoding.adaptive import ConfidenceStop, CostStop, FixedLength
from quickdraft.settings.options import options_from

pytestmark = pytest.mark.usefixtures("flat_costs")


def _engine(tiny_model_dir, **options) -> Engine:
    return Engine.load(tiny_model_dir, options_from({"drafter": f"model:{tiny_model_dir}", **options}), "float32")


def _policy(engine: Engine):
    from quickdraft.config import SamplingConfig

    decoder = engine.method.build(engine.parts, SamplingConfig())
    return decoder.make_policy()


def _drafts_pmin_chains(engine: Engine, tiny_model_dir) -> CostStop:
    """Assert `engine` drafts chains of up to 8 under the cost schedule, with plain decoding's output;
    its policy."""
    out = engine.generate("abc", max_new_tokens=16)
    plain = Engine.load(tiny_model_dir, options_from({"method": "ar"}), "float32").generate("abc", max_new_tokens=16)
    assert out.token_ids == plain.token_ids
    assert out.stats.extra["draft_pmin_auto"] == 8 and out.stats.num_draft_tokens > 0
    policy = _policy(engine)
    assert isinstance(policy, CostStop) and policy.gamma == 8
    return policy


def test_a_draft_model_drafts_pmin_chains_by_default(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    policy = _drafts_pmin_chains(engine, tiny_model_dir)
    curve = engine.parts.memo["host_costs"][0]  # priced by the host's measured curve
    assert all(policy.cost(rows, 0) == relative_cost(curve, rows) for rows in (1, 2, 5, 9))


def test_without_a_curve_the_chain_stops_at_p_min(tiny_model_dir):
    """The reference runtime measures no verify curve: the p-min chain of llama.cpp's kind instead."""
    engine = _engine(tiny_model_dir, runtime="hf")
    out = engine.generate("abc", max_new_tokens=8)
    assert out.stats.extra["draft_pmin_auto"] == 8 and out.stats.num_draft_tokens > 0
    policy = _policy(engine)
    assert type(policy) is ConfidenceStop and (policy.gamma, policy.threshold) == (8, 0.7)


@pytest.mark.parametrize(
    ("options", "expected"),
    [({"draft_length": "4"}, (FixedLength, 4)), ({"draft_schedule": "confidence"}, (ConfidenceStop, 4))],
)
def test_a_draft_option_given_keeps_the_chain_asked_for(tiny_model_dir, options, expected):
    engine = _engine(tiny_model_dir, **options)
    out = engine.generate("abc", max_new_tokens=8)
    assert "draft_pmin_auto" not in out.stats.extra and out.stats.num_draft_tokens > 0
    policy = _policy(engine)
    assert type(policy) is expected[0] and policy.gamma == expected[1]


def test_kinds_without_pmin_keep_fixed_chains(tiny_model_dir):
    """The negative control: a copied draft (`truncated:`) has no p-min default."""
    engine = Engine.load(tiny_model_dir, options_from({"drafter": "truncated:1"}), "float32")
    out = engine.generate("abc", max_new_tokens=8)
    assert "draft_pmin_auto" not in out.stats.extra and out.stats.num_draft_tokens > 0
    assert type(_policy(engine)) is FixedLength


def test_pearls_window_stops_where_the_draft_is_unsure(tiny_model_dir, tmp_path):
    """PEARL in one process takes the same default: its window ends early where the draft is unsure,
    so it may be as long as the p-min chain; a fixed schedule keeps PEARL's own window."""
    from quickdraft.config import SamplingConfig

    from conftest import tiny_text_model

    engine = _engine(tiny_model_dir, method="pearl")
    decoder = engine.method.build(engine.parts, SamplingConfig())
    assert decoder.keep_drafting is not None and decoder.gamma >= 8
    other = tiny_text_model(seed=1)  # a draft that disagrees with the target: windows get rejected
    other.model.save_pretrained(tmp_path)
    other.tokenizer.save_pretrained(tmp_path)
    plain = Engine.load(tiny_model_dir, options_from({"method": "ar"}), "float32").generate("abc", max_new_tokens=24)
    steps = {}
    for schedule in ("fixed", "confidence"):
        options = {"drafter": f"model:{tmp_path}", "method": "pearl", "gamma": "6", "guard": "0"}
        options |= {"draft_schedule": schedule, "confidence_threshold": "0.99"}
        run = Engine.load(tiny_model_dir, options_from(options), "float32")
        out = run.generate("abc", max_new_tokens=24)
        assert out.token_ids == plain.token_ids and out.stats.num_draft_tokens > 0
        assert (run.method.build(run.parts, SamplingConfig()).keep_drafting is None) == (schedule == "fixed")
        steps[schedule] = run.drafter.draft_steps
    assert steps["confidence"] < steps["fixed"]  # unsure drafts stopped the windows early


def test_the_batched_decoder_drafts_the_same_pmin_chains(tiny_model_dir):
    """The server's continuous batching takes the default too: chains of up to 8 that end where the
    draft is unsure, with output equal to plain decoding; a draft option given keeps its fixed chains."""
    from quickdraft.config import SamplingConfig, StopConfig

    engine = _engine(tiny_model_dir)
    plan, _ = engine.batch_plan()
    request = plan.request(1, 100)
    assert not plan.trees and request.budget == 8 and request.keep_drafting is not None
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    stop = StopConfig(max_new_tokens=16)
    got = engine.generate_batch(prompts, SamplingConfig(), stop, max_batch=2)
    plain = Engine.load(tiny_model_dir, options_from({"method": "ar"}), "float32")
    assert [g.token_ids for g in got] == [plain.generate_ids(p, SamplingConfig(), stop).token_ids for p in prompts]
    assert sum(g.stats.num_draft_tokens for g in got) > 0
    given = _engine(tiny_model_dir, draft_length="4").batch_plan()[0].request(1, 100)
    assert given.budget == 4 and given.keep_drafting is None  # the negative control: fixed chains of 4


def test_a_mixed_tree_takes_its_model_stages_pmin_chain(tiny_model_dir):
    """`mix:model:...` (the pair's default drafter) drafts the model stage's p-min chain, priced on this
    host's costs, with output equal to plain decoding; `mix:truncated:1`, whose stage has no p-min
    default, keeps fixed chains (the control; before the fix, mix drafted fixed chains of 4 either way)."""
    engine = Engine.load(tiny_model_dir, options_from({"drafter": f"mix:model:{tiny_model_dir}"}), "float32")
    assert engine.drafter.pmin == engine.drafter.model.pmin == (8, 0.7)
    _drafts_pmin_chains(engine, tiny_model_dir)
    plan, _ = engine.batch_plan()  # the server's batches take the same chains
    request = plan.request(1, 100)
    assert not plan.trees and request.budget == 8 and request.keep_drafting is not None
    control = Engine.load(tiny_model_dir, options_from({"drafter": "mix:truncated:1"}), "float32")
    assert control.drafter.pmin is None and type(_policy(control)) is FixedLength


def test_the_fast_forms_window_is_fitted_and_a_window_given_is_not(tiny_model_dir):
    """`model:X` leaves its window to the fast form, fitted to each generation's budget (`draft_models/window.py`);
    `model:X;window=N` reads N prompt tokens whatever the budget."""
    auto = Engine.load(tiny_model_dir, options_from({"drafter": f"model:{tiny_model_dir}"}), "float32")
    given = Engine.load(tiny_model_dir, options_from({"drafter": f"model:{tiny_model_dir};window=12"}), "float32")
    assert auto.drafter.window.fitted and not given.drafter.window.fitted
    assert given.drafter.fork().window.size == 12 and auto.drafter.fork().window.fitted
