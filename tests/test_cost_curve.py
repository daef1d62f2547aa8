"""The host-sized tree budget: interpolation of the cost curve, the budget choice on pinned curves
(never this host's), and `draft_tree` auto through the engine (a chain where trees cannot run)."""

from __future__ import annotations

import pytest

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.costs import cost_curve
from quickdraft.costs.cost_curve import best_budget, measure_cost_curve, relative_cost, tree_draft_forwards
from quickdraft.drafters.model_free.suffix import TREE_GAIN, SuffixDrafter
from quickdraft.drafters.model_free.suffix_index import SuffixIndex, concat_documents
from quickdraft.settings.options import options_from

from conftest import FLAT_CURVE as AVX512
from conftest import tiny_llama

# measured shapes (issue #24): AVX-512-BF16 EPYC with a 200-token cache (conftest's), and an AVX2-only host
AVX2 = {1: 1.0, 2: 1.38, 3: 1.79, 5: 2.66, 9: 4.2, 13: 5.7, 17: 7.15, 25: 10.0, 33: 13.0}


def test_relative_cost_interpolates_and_extrapolates():
    assert relative_cost(AVX2, 2) == 1.38
    assert relative_cost(AVX2, 4) == pytest.approx((1.79 + 2.66) / 2)
    assert relative_cost({1: 1.0, 3: 2.0}, 5) == pytest.approx(3.0)  # the last slope continued


def test_budget_follows_the_curve():
    assert best_budget(AVX512, TREE_GAIN) == 8  # flat to 9 rows: a tree of 8
    assert best_budget(AVX2, TREE_GAIN) == 1  # 2 rows cost 1.38 steps: one draft at most
    assert best_budget({w: float(w) for w in (1, 2, 5, 9)}, TREE_GAIN) == 0  # nothing pays
    assert best_budget(AVX512, TREE_GAIN, limit=4) == 4


def test_a_model_drafters_own_forwards_shrink_the_budget():
    """A drafter that costs something per forward (a trained head) gets a smaller tree, or none."""
    assert [tree_draft_forwards(b, 8) for b in (1, 8, 9, 16, 17)] == [1, 1, 2, 2, 3]
    assert tree_draft_forwards(4, 2) == 2
    assert best_budget(AVX512, TREE_GAIN, draft_cost=lambda b: 0.0) == best_budget(AVX512, TREE_GAIN) == 8
    assert best_budget(AVX512, TREE_GAIN, draft_cost=lambda b: 0.3 * tree_draft_forwards(b, 8)) == 8
    assert best_budget(AVX512, TREE_GAIN, draft_cost=lambda b: 0.3 * tree_draft_forwards(b, 2)) == 4
    assert best_budget(AVX512, TREE_GAIN, draft_cost=lambda b: 1.5 * tree_draft_forwards(b, 8)) == 0


def _auto_engine(target, monkeypatch, curve, **options):
    monkeypatch.setattr(cost_curve, "_MEMO", {cost_curve.host_key(target.name, "bfloat16"): curve})
    index = SuffixIndex(concat_documents([[1, 2, 3, 4, 5, 6, 7, 8] * 4]))
    return Engine(target, options_from(options), drafter=SuffixDrafter(index))


def test_auto_budget_through_the_engine_is_reported(monkeypatch):
    target = tiny_llama(vocab=64, layers=2, seed=3)
    out = _auto_engine(target, monkeypatch, AVX512).generate_ids([1, 2, 3], SamplingConfig(), StopConfig(12))
    assert out.stats.extra["tree_budget_auto"] == 8 and out.stats.extra["tree_rounds"] > 0
    out = _auto_engine(target, monkeypatch, {1: 1.0, 2: 3.0, 5: 6.0, 9: 9.0}).generate_ids(
        [1, 2, 3], SamplingConfig(), StopConfig(12)
    )
    assert out.stats.extra == {"tree_auto_no_speculation": 1} and out.stats.num_draft_tokens == 0


def test_auto_falls_back_to_a_chain_on_the_hf_runtime(monkeypatch):
    target = tiny_llama(vocab=64, layers=2, seed=3)
    engine = _auto_engine(target, monkeypatch, AVX512, runtime="hf")
    out = engine.generate_ids([1, 2, 3, 4, 5, 6, 7], SamplingConfig(), StopConfig(12))
    assert out.stats.extra.get("tree_auto_fallback_chain") == 1 and "tree_rounds" not in out.stats.extra
    assert out.stats.num_draft_tokens > 0  # still speculating, as a chain


def test_other_drafters_keep_chains_under_auto():
    target = tiny_llama(vocab=64, layers=2, seed=3)
    out = Engine(target, options_from({"drafter": "ngram"})).generate_ids(
        [1, 2, 1, 2, 1], SamplingConfig(), StopConfig(8)
    )
    assert "tree_rounds" not in out.stats.extra and "tree_budget_auto" not in out.stats.extra


def test_measured_curve_has_every_width():
    from quickdraft.runtime.choose import cached_model

    target = tiny_llama(vocab=64, layers=1, seed=3)
    curve = measure_cost_curve(cached_model(target.model, 64), widths=(1, 2, 5), context=16, repeats=2)
    assert set(curve) == {1, 2, 5} and curve[1] == 1.0 and all(v > 0 for v in curve.values())


def test_a_drafters_lookups_are_priced_once_a_drafted_round(monkeypatch):
    """The suffix drafter's measured lookups (index search, tree building) join every drafted round's
    price: the guard's and the auto budget's. Large enough, they turn speculation off."""
    from quickdraft.drafters.model_free.suffix import SuffixDrafter

    target = tiny_llama(vocab=64, layers=2, seed=3)
    monkeypatch.setattr(SuffixDrafter, "lookup_seconds", lambda self: 0.0)
    out = _auto_engine(target, monkeypatch, AVX512).generate_ids([1, 2, 3], SamplingConfig(), StopConfig(12))
    assert out.stats.extra["tree_budget_auto"] == 8
    monkeypatch.setattr(SuffixDrafter, "lookup_seconds", lambda self: 10.0)  # ten seconds a round: never pays
    out = _auto_engine(target, monkeypatch, AVX512).generate_ids([1, 2, 3], SamplingConfig(), StopConfig(12))
    assert out.stats.extra == {"tree_auto_no_speculation": 1} and out.stats.num_draft_tokens == 0


def test_the_suffix_drafters_lookup_is_measured_without_touching_its_request(monkeypatch):
    from quickdraft.drafters.model_free.suffix import SuffixDrafter

    monkeypatch.undo()  # the real measurement (conftest prices lookups at zero)
    index = SuffixIndex(concat_documents([list(range(5, 60)) * 60]))
    drafter = SuffixDrafter(index)
    drafter.begin([1, 2])
    drafter.last_context = [1, 2, 3]
    assert 0 < drafter.lookup_seconds() < 1
    assert drafter.last_context == [1, 2, 3]  # the request's state, as it was
    assert SuffixDrafter(None).lookup_seconds() > 0  # no datastore: a synthetic context


def test_drafting_costs_are_kept_per_host_for_the_shipped_target(tmp_path, monkeypatch):
    """A draft step's and a drafter's lookups' prices are measured once per host for the embedded
    default (like its curve), so every process sizes trees and guards rounds alike; another target's
    are measured each time they are asked for (once per engine)."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(cost_curve, "PERSIST_DRAFTING", True)
    monkeypatch.setattr(cost_curve, "_MEMO", {})
    calls: list[str] = []

    def measure(value):
        return lambda: calls.append(value) or (value, 0.01)

    first = cost_curve.drafting_costs("m", "bfloat16", True, "none", "head|head", measure(0.25))
    monkeypatch.setattr(cost_curve, "_MEMO", {})  # a new process: read from the cache folder
    again = cost_curve.drafting_costs("m", "bfloat16", True, "none", "head|head", measure(0.5))
    assert first == again == (0.25, 0.01) and calls == [0.25]
    assert cost_curve.drafting_costs("m", "bfloat16", True, "none", "distilled|distilled", measure(0.3)) == (0.3, 0.01)
    assert cost_curve.drafting_costs("m", "bfloat16", False, "none", "head|head", measure(0.7)) == (0.7, 0.01)
    assert calls == [0.25, 0.3, 0.7] and len(list((tmp_path / "costs").iterdir())) == 2


def test_a_changed_kernel_build_is_measured_anew(monkeypatch, tmp_path):
    """The curve's key names the fused kernels' whole build (level and source hash): two builds of one
    level get two curves. The control: two levels differ in any case (the old key, cut to the level's
    first 8 letters, told levels apart but not builds, and kept a curve across kernel changes)."""
    from quickdraft.runtime import kernels
    from quickdraft.runtime.kernels import linear

    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels on this host")
    monkeypatch.setattr(linear, "packing", lambda *a, **k: "fused")  # nothing measured nor kept for the fake builds
    keys = {}
    for name in ("avx512_bf16-0123456789abcdef", "avx512_bf16-fedcba9876543210", "avx2-0123456789abcdef"):
        monkeypatch.setattr(kernels, "build_dir", lambda level=None, n=name: tmp_path / n)
        keys[name] = cost_curve.host_key("m", "bfloat16", "w4a8")
    assert len(set(keys.values())) == 3
    assert all(name in key for name, key in keys.items())


class _Host:
    """A host whose speed drops by `slow` after its first `fast_calls` measurements (a 2-core guest
    that changed speed level): each call returns `seconds` scaled by the speed of its turn."""

    def __init__(self, fast_calls: int, slow: float = 1.65) -> None:
        self.calls, self.fast_calls, self.slow = 0, fast_calls, slow

    def timer(self, seconds: float):
        def measure() -> float:
            self.calls += 1
            return seconds * (1.0 if self.calls <= self.fast_calls else self.slow)

        return measure


def test_a_ratio_measured_side_by_side_survives_a_change_of_speed():
    from quickdraft.costs.timing import paired_ratio

    host = _Host(fast_calls=1)  # the draft's first step fast, everything after it slow
    ratio, step = paired_ratio(host.timer(0.007), host.timer(0.027))
    assert ratio == pytest.approx(0.007 / 0.027)
    assert step == pytest.approx(0.027 * 1.65)
    # negative control: one measurement of each, one after the other (the old way), is 65% off
    once = _Host(fast_calls=1)
    assert paired_ratio(once.timer(0.007), once.timer(0.027), rounds=1)[0] == pytest.approx(0.007 / 0.027 / 1.65)


def test_the_draft_price_is_measured_side_by_side(monkeypatch):
    from types import SimpleNamespace

    from quickdraft.decoding import parts as parts_module

    host = _Host(fast_calls=1)  # the first draft step fast, every step after it slow
    drafter = SimpleNamespace(name="x", step_seconds=host.timer(0.007), lookup_seconds=lambda: 0.0027)
    monkeypatch.setattr(parts_module, "step_seconds", lambda target: host.timer(0.027)())
    config = SimpleNamespace(drafter="model:x", dtype="bfloat16", quantize="none")
    parts = parts_module.DecodeParts(target=None, drafter=drafter, config=config, target_name="not-kept")
    ratio, lookup = parts_module.drafting(parts)
    assert ratio == pytest.approx(0.007 / 0.027)
    assert lookup == pytest.approx(0.0027 / (0.027 * 1.65))
