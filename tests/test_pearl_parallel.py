"""Parallel PEARL (two gloo worker processes) equals the sequential state machine; failures are
reported and clean up both workers."""

from __future__ import annotations

import os
import threading
import time

import pytest

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding.pearl_logic import PearlConfig
from quickdraft.decoding.pearl_parallel import ParallelPearl, ParallelSpec, split_cores
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.engine import Engine, EngineConfig
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import load_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores"),
]

PROMPTS = [[5, 6, 7, 8], [9, 9, 9], [10, 20, 10, 20, 10]]


def _spec(model_dir, drafter="truncated:1", **pearl):
    cfg = PearlConfig(**{"gamma": 3, **pearl})
    return ParallelSpec(model_dir, parse_drafter_spec(drafter), "float32", cfg, None, split_cores())


@pytest.mark.parametrize("sampling", [SamplingConfig(seed=0), SamplingConfig(temperature=1.0, seed=6)])
def test_parallel_equals_sequential(tiny_model_dir, sampling):
    target = load_model(tiny_model_dir, "float32")
    config = EngineConfig(  # unguarded and pre-verifying, as the two-process runner is: the same rounds draw for draw
        method="pearl",
        drafter="truncated:1",
        pearl=PearlConfig(gamma=3, pre_verify=True),
        draft=DraftConfig(guard=False),
    )
    seq = Engine(target, config, dtype="float32")
    with ParallelPearl(_spec(tiny_model_dir)) as par:
        assert par.gamma == 3
        for prompt in PROMPTS:
            stop = StopConfig(40, target.eos_token_ids)
            a = seq.generate_ids(prompt, sampling, stop)
            b = par.generate(prompt, sampling, stop)
            assert b.token_ids == a.token_ids
            assert b.stats.accepted_lengths == a.stats.accepted_lengths
            assert b.stats.num_draft_tokens == a.stats.num_draft_tokens > 0
        procs = list(par.procs)
    assert all(not p.is_alive() for p in procs)


def test_auto_gamma_and_engine_method(tiny_model_dir):
    target = load_model(tiny_model_dir, "float32")
    eng = Engine(
        target,
        EngineConfig(
            method="pearl", drafter="truncated:1", pearl=PearlConfig(parallel=True), draft=DraftConfig(guard=False)
        ),
        dtype="float32",
    )  # unguarded: two processes as asked, whatever this host measures
    try:
        res = eng.generate_ids([5, 6, 7], SamplingConfig(), StopConfig(12, target.eos_token_ids))
        assert 1 <= eng.parallel_runner().gamma <= 16
        ref = Engine(target, EngineConfig(method="ar"), dtype="float32")
        assert (
            res.token_ids
            == ref.generate_ids([5, 6, 7], SamplingConfig(), StopConfig(12, target.eos_token_ids)).token_ids
        )
        # parallel PEARL streams like every decoder: the same tokens, round by round
        streamed = [t for kept, _ in eng.stream_ids([5, 6, 7], SamplingConfig(), StopConfig(12)) for t in kept]
        assert streamed == res.token_ids
        # a consumer that stops early cancels the workers' generation; the next request is unaffected
        stream = eng.stream_ids([5, 6, 7], SamplingConfig(), StopConfig(400))
        next(stream)
        stream.close()
        again = eng.generate_ids([5, 6, 7], SamplingConfig(), StopConfig(12, target.eos_token_ids))
        assert again.token_ids == res.token_ids
    finally:
        eng.close()


def test_a_failing_worker_is_reported_and_both_stop(tiny_model_dir):
    with pytest.raises(QuickdraftError, match="draft worker failed: .*not found"):
        ParallelPearl(_spec(tiny_model_dir, drafter="model:/nonexistent/draft"))


def test_a_killed_worker_mid_generation_stops_the_other(tiny_model_dir):
    par = ParallelPearl(_spec(tiny_model_dir))
    procs = list(par.procs)
    errors = []

    def run():
        try:
            deadline = time.monotonic() + 30  # generating until the kill lands (a fast host did 200 in 1.1 s)
            while time.monotonic() < deadline:
                par.generate([5, 6, 7], SamplingConfig(temperature=1.0, seed=1), StopConfig(400))
        except QuickdraftError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    procs[1].kill()  # the draft dies mid-generation
    t.join(timeout=60)
    assert not t.is_alive()
    assert errors and "draft" in errors[0]
    for p in procs:
        p.join(timeout=10)
        assert not p.is_alive()


def test_one_core_is_refused_clearly():
    with pytest.raises(QuickdraftError, match="at least 2 CPU cores"):
        split_cores({0})
    assert split_cores({0, 1, 2}) == ((0, 1), (2,))


def test_parallel_is_declined_where_one_process_measures_faster(tiny_model_dir, monkeypatch, capsys):
    """--parallel asks; the measured round costs decide (`registry.parallel_pays`): where two
    processes would be slower the engine runs PEARL in one and says so (stderr once, and the
    statistics), with the same tokens; --no-guard runs it as asked."""
    from quickdraft.decoding import registry

    target = load_model(tiny_model_dir, "float32")
    config = EngineConfig(method="pearl", drafter="truncated:1", pearl=PearlConfig(parallel=True))
    monkeypatch.setattr(registry, "parallel_pays", lambda parts: (False, "measured slower (test)"))
    eng = Engine(target, config, dtype="float32")
    res = eng.generate_ids([5, 6, 7], SamplingConfig(), StopConfig(12, target.eos_token_ids))
    assert res.stats.extra.get("pearl_parallel_declined") == 1 and res.stats.num_draft_tokens > 0
    assert "--parallel declined: measured slower (test)" in capsys.readouterr().err
    with pytest.raises(QuickdraftError, match="does not run parallel PEARL"):
        eng.parallel_runner()
    ref = Engine(target, EngineConfig(method="ar"), dtype="float32")
    stop = StopConfig(12, target.eos_token_ids)
    assert res.token_ids == ref.generate_ids([5, 6, 7], SamplingConfig(), stop).token_ids
    monkeypatch.undo()  # the real measurement, on the engine's own target and draft
    ok, why = registry.parallel_pays(eng.parts)
    assert isinstance(ok, bool) and "ms in two processes" in why and "ms in one" in why
