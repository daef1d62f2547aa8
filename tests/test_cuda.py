"""The CUDA path (issue #27), on tiny in-process models: the same outputs on the GPU as on the CPU,
device generators, the graphed batched forward equal to the eager one. Every test here needs a CUDA
device and skips without one (CI has none); `scripts/gpu_check.sh` runs them where one is."""

from __future__ import annotations

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding.common import Generators
from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.graphs import StaticBatchForward

from conftest import tiny_llama, tiny_text_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh)"),
]


def test_native_forward_on_cuda_equals_cpu():
    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float32).model
    cpu = NativeCachedModel(model)
    want = cpu.extend(list(range(3, 40)))
    gpu = NativeCachedModel(model.to("cuda"))
    got = gpu.extend(list(range(3, 40)))
    assert got.device.type == "cuda" and torch.allclose(got.cpu(), want, atol=1e-4)


@pytest.mark.parametrize("method,drafter", [("ar", "ngram"), ("sd", "ngram"), ("sd", "suffix:none")])
def test_greedy_generation_on_cuda_equals_cpu(method, drafter):
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    outs = {}
    for device in ("cpu", "cuda"):
        target = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64)
        engine = Engine(target, EngineConfig(method=method, drafter=drafter, device=device))
        outs[device] = engine.generate_ids(prompt, SamplingConfig(), StopConfig(32))
    assert outs["cuda"].token_ids == outs["cpu"].token_ids
    assert method == "ar" or outs["cuda"].stats.num_accepted_draft_tokens > 0  # speculation happened


def test_greedy_chain_graphs_equal_the_cpu_across_a_span_bucket():
    """Plain greedy decoding of a lone request on CUDA: one captured step a token (forward, head,
    argmax, next inputs), steps in flight ahead of the host's reads, equal to the CPU's plain loop in
    float64 across the 256 -> 512 span bucket and at an EOS inside a chunk."""
    prompt = [(7 * i) % 45 + 3 for i in range(250)]
    cpu = Engine(tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64), EngineConfig(method="ar", graphs="off"))
    want = cpu.generate_ids(prompt, SamplingConfig(), StopConfig(40)).token_ids
    gpu = Engine(tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64), EngineConfig(method="ar", device="cuda"))
    assert gpu.generate_ids(prompt, SamplingConfig(), StopConfig(40)).token_ids == want
    eos = StopConfig(40, eos_token_ids=(want[9],))
    assert gpu.generate_ids(prompt, SamplingConfig(), eos).token_ids == want[: want.index(want[9]) + 1]
    static = gpu.parts.memo["batch_decoder", 1].target.static
    assert static.chain_steps >= 39 + 9 and sorted(static.chains) == static.spans()  # all captured at warm-up
    report = gpu.graph_report()
    assert report["late_captures"] == 0 and report["graph_mib"] >= 0 and report["capture_s"] > 0


def test_rounds_drafted_ahead_on_cuda_equal_the_cpu():
    """Over real graphs the next round is drafted while the verify replays (decoding/ahead.py): the
    tokens equal the CPU's plain loop, and drafts made ahead were kept."""
    prompt = [(5 * i) % 11 + 3 for i in range(60)] + [31] * 8  # as tests/test_ahead.py
    model = lambda: tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64)  # noqa: E731
    want = Engine(model(), EngineConfig(method="ar", device="cpu")).generate_ids(
        prompt, SamplingConfig(), StopConfig(48)
    )
    config = EngineConfig(method="sd", drafter="suffix:none", device="cuda", draft=DraftConfig(guard=False))
    got = Engine(model(), config).generate_ids(prompt, SamplingConfig(), StopConfig(48))
    assert got.token_ids == want.token_ids
    assert got.stats.num_accepted_draft_tokens > 0 and got.stats.extra.get("ahead_hits", 0) > 0


def test_sampling_uses_device_generators():
    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(target, EngineConfig(drafter="suffix:none", device="cuda"))
    a = engine.generate("abcabc", max_new_tokens=24, temperature=1.0, seed=3)
    b = engine.generate("abcabc", max_new_tokens=24, temperature=1.0, seed=3)
    assert a.token_ids == b.token_ids  # seeded on the device
    assert Generators.from_seed(1, "cuda").target.device.type == "cuda"


def test_graphed_batch_forward_equals_eager():
    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float32).model.to("cuda")
    eager, graphed = BatchedTarget(NativeCachedModel(model), 4), BatchedTarget(NativeCachedModel(model), 4)
    graphed.static = StaticBatchForward(graphed, 256, graphs=True)
    for t in (eager, graphed):
        for p in ([5, 6, 7, 8], [9, 10], list(range(11, 30))):
            t.prefill(p, first=True)
            t.adopt()
    for _ in range(3):  # capture, then replays
        blocks = [RowBlock([1, 2, 3]), RowBlock([4]), RowBlock([5, 6])]
        for x, y in zip(eager.forward(blocks), graphed.forward(blocks), strict=True):
            assert torch.allclose(x, y, atol=1e-4)
        for t in (eager, graphed):
            for row, block in enumerate(blocks):
                t.commit(row, range(len(block.tokens)))
    assert graphed.static.captured and graphed.static.replays == 3


def test_graphed_lone_row_with_its_head_inside_equals_eager():
    """A batch of one (a lone request) graphed with its LM head inside, across span buckets (a row
    passing 256 positions is captured again at 512): the logits equal the eager forward's."""
    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float32).model.to("cuda")
    eager, graphed = BatchedTarget(NativeCachedModel(model), 1), BatchedTarget(NativeCachedModel(model), 1)
    graphed.static = StaticBatchForward(graphed, 1024, graphs=True)
    for t in (eager, graphed):
        t.prefill([(7 * i) % 45 + 3 for i in range(250)], first=True)
        t.adopt()
    kept = []  # what a drafter keeps of each forward (features, logits) must outlive the next replay
    for _ in range(3):  # 250 -> 254 -> 258 -> 262 positions: the 256 bucket, then 512 twice
        blocks = [RowBlock([1, 2, 3, 4])]
        (x,), ((y,), (f,)) = eager.forward(blocks), graphed.forward_features(blocks)
        assert torch.allclose(x, y, atol=1e-4)
        kept.append((y, y.clone(), f, f.clone()))
        for t in (eager, graphed):
            t.commit(0, range(4))
    assert all(torch.equal(y, y0) and torch.equal(f, f0) for y, y0, f, f0 in kept)
    assert sorted(graphed.static.captured) == [(4, 256), (4, 512)] and graphed.static.replays == 3


def test_batched_engine_on_cuda_equals_lone_requests():
    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(target, EngineConfig(drafter="suffix:none", device="cuda"))
    prompts = ["abcabcabc", "hello hello", "the cat. the cat."]
    alone = [engine.generate(p, max_new_tokens=24).token_ids for p in prompts]
    together = [r.token_ids for r in engine.generate(prompts, max_new_tokens=24)]
    assert together == alone


def test_distill_trains_on_cuda(tmp_path):
    """`distill --device cuda`: both models and every batch on the GPU, bf16 autocast, on-policy
    generation included: every step gives a finite loss."""
    from test_distill import _examples

    from quickdraft.training.student import make_student
    from quickdraft.training.trainer import DistillConfig, Distiller

    target = tiny_llama(vocab=32, layers=3, seed=0)
    student = make_student(target, "truncated:1")
    cfg = DistillConfig(
        output=str(tmp_path / "run"), steps=6, batch_size=4, max_response_tokens=6, mix="fixed=1,target=1,draft=1"
    )
    history = Distiller(target, student, _examples(), cfg, device="cuda").train(progress=False)
    assert next(student.model.parameters()).device.type == "cuda"
    assert len(history) == 6 and all(torch.isfinite(torch.tensor(r["loss"])) for r in history)


def test_head_trees_draft_on_cuda():
    """The feature head drafting trees on the GPU, as `train-draft`'s gain table runs it after
    training (a tree level's mask and positions were once built on the CPU: the first GPU run lost
    its trained head to that)."""
    from quickdraft.training.decode_eval import decode_eval
    from quickdraft.training.train_heads import HeadTrainingConfig, new_module

    target = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float32)
    target.model.to("cuda")
    module = new_module("head", target.model, HeadTrainingConfig()).to("cuda")
    for tree, width in ((0, 1), (4, 2), (8, 4)):
        got = decode_eval(module, "head", target, None, [[5, 6, 7, 5, 6, 7]], 12, tree=tree, width=width)
        assert got["tokens_per_target_forward"] >= 1.0 and got["prompts"] == 1
