"""Every graph captured before timing (issue #70 item 1), on a CPU: the static forward records
`EagerGraph`s (`runtime/forward/capture.py`: a replay reruns the captured step into the outputs of
its capture, as a CUDA graph replays into its fixed buffers), so which buckets the engine's warm-up
captures, the inputs a capture puts back and outputs that the next replay overwrites are tested
here; `tests/test_cuda.py` runs the real captures where a GPU is."""

from __future__ import annotations

import functools

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.capture import EagerGraph
from quickdraft.runtime.forward.graphs import WIDTHS, StaticBatchForward

from conftest import tiny_llama

PROMPT = [(7 * i) % 45 + 3 for i in range(244)]  # 40 new tokens cross the 256 -> 512 span bucket


@pytest.fixture
def emulated(monkeypatch):
    """Engines built in the test capture emulated graphs."""
    monkeypatch.setattr("quickdraft.engine.StaticBatchForward", functools.partial(StaticBatchForward, emulate=True))


def _model():
    return tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64)


def _plain(prompt, sampling=None, n=40):
    sampling = sampling or SamplingConfig()
    return Engine(_model(), EngineConfig(method="ar", graphs="off", device="cpu")).generate_ids(
        prompt, sampling, StopConfig(n)
    )


@pytest.mark.parametrize("method,drafter", [("ar", None), ("sd", "suffix:none"), ("sd", "ngram")])
def test_warm_up_captures_every_bucket_and_generation_none(emulated, method, drafter, flat_costs):
    want = _plain(PROMPT)
    engine = Engine(_model(), EngineConfig(method=method, drafter=drafter, graphs="on", device="cpu"))
    got = engine.generate_ids(PROMPT, SamplingConfig(), StopConfig(40))
    assert got.token_ids == want.token_ids  # float64: the replayed graphs give plain decoding's tokens
    static = engine.parts.memo["batch_decoder", 1].target.static
    spans = static.spans()
    assert spans[:2] == [256, 512] and spans[-1] == static.capacity
    report = engine.graph_report()
    assert report["late_captures"] == 0 and report["graphs"] == len(static.captured) + len(static.chains)
    assert sorted(static.chains) == spans  # a chain step per span, the unused ones included
    widths = {w for w, _ in static.captured}
    assert widths == ({1} if drafter is None else set(WIDTHS[: len(widths)]))  # 1, 2, 4, ... up to the widest
    assert {s for _, s in static.captured} == set(spans)
    if drafter is not None:
        assert len(widths) > 1 and got.stats.num_accepted_draft_tokens > 0  # speculation happened
        assert static.replays > 0  # drafted rounds replayed verify graphs
    assert static.chain_steps > 0


def test_a_warm_up_too_narrow_counts_its_late_captures(emulated, monkeypatch, flat_costs):
    """Negative control: a warm-up that captures width 1 only leaves the drafted rounds' widths to
    be captured inside the generation, and the report says so."""
    prepare = StaticBatchForward.prepare
    monkeypatch.setattr(StaticBatchForward, "prepare", lambda self, max_width=1: prepare(self, 1))
    engine = Engine(_model(), EngineConfig(method="sd", drafter="suffix:none", graphs="on", device="cpu"))
    got = engine.generate_ids(PROMPT, SamplingConfig(), StopConfig(40))
    assert got.token_ids == _plain(PROMPT).token_ids
    assert got.stats.num_accepted_draft_tokens > 0 and engine.graph_report()["late_captures"] > 0


def test_seeded_sampling_on_replayed_graphs_equals_plain_decoding(emulated):
    """A sampled lone row runs rounds (no chain) over the (width, span) graphs: seeded, its tokens are
    plain decoding's (each output position's own noise), across the span bucket."""
    sampling = SamplingConfig(temperature=0.9, seed=3)
    want = _plain(PROMPT, sampling)
    engine = Engine(_model(), EngineConfig(method="sd", drafter="suffix:none", graphs="on", device="cpu"))
    got = engine.generate_ids(PROMPT, sampling, StopConfig(40))
    assert got.token_ids == want.token_ids and got.stats.num_draft_tokens > 0
    assert engine.graph_report()["late_captures"] == 0


def test_a_replay_overwrites_the_captured_outputs_and_kept_rows_survive():
    """The graph's outputs are fixed buffers: the next replay overwrites them, so rows a caller keeps
    (a feature-reading drafter) must be copies; with emulated graphs, as on CUDA, they are."""
    single = NativeCachedModel(_model().model)
    target = BatchedTarget(single, 1)
    static = StaticBatchForward(target, 512, emulate=True)
    static.prepare(4)
    single.extend([3, 4, 5, 6])
    target.adopt()
    target.static = static
    first = target.forward_features([RowBlock([7, 8])])[1][0]
    kept = first.clone()
    target.commit(0, [0, 1])
    target.forward_features([RowBlock([9, 10])])
    assert torch.equal(first, kept)  # not a view of the buffer the second replay wrote
    graph = static.captured[(2, 256)]
    assert isinstance(graph, EagerGraph) and not torch.equal(graph.out[0][:2], kept)  # the buffer moved on


def test_prepare_refuses_running_rows_and_does_nothing_eagerly():
    single = NativeCachedModel(_model().model)
    target = BatchedTarget(single, 1)
    eager = StaticBatchForward(target, 512, graphs=False)
    eager.prepare()
    assert eager.capturer is None and not eager.captured
    single.extend([3, 4, 5])
    target.adopt()
    with pytest.raises(ValueError, match="rows are running"):
        StaticBatchForward(target, 512, emulate=True).prepare()


def test_prepare_leaves_out_widths_the_capacity_cannot_hold():
    """A cache of 48 positions: widths of 64 never run static (they take the dynamic forward), so the
    warm-up captures up to 32, and nothing writes past the cache."""
    model = _model().model
    model.config.max_position_embeddings = 48  # a model whose context is 48 positions
    target = BatchedTarget(NativeCachedModel(model), 1)
    static = StaticBatchForward(target, 48, emulate=True)
    static.prepare(64)
    assert static.capacity == 48 and static.spans() == [48]
    assert sorted(w for w, _ in static.captured) == [1, 2, 4, 8, 16, 32]
