"""Training drafts from a feature store, unrolled, resumable (issue #26).

- the store gives back exactly what the target computed, computes each window once, keeps only
  flushed windows across a crash, and refuses a store built for other data;
- the unrolled head (training-time test) computes exactly what the drafter computes while drafting
  (float64, its own predicted features, its own cache), and a plainly causal mask does not;
- a run interrupted and resumed ends with the same weights, bit for bit, as one that was not (the
  RNG stream included: without it the block drafter's cuts differ and the test fails).
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from quickdraft.cli import main
from quickdraft.drafters.from_target.feature_head import FeatureHeadDrafter
from quickdraft.drafters.from_target.reuse import HeadLM
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.native import NativeLlama
from quickdraft.training import train_run
from quickdraft.training.decode_eval import GAIN_BUDGETS
from quickdraft.training.feature_store import FEATURES, Batch, FeatureStore
from quickdraft.training.train_heads import (
    HeadTrainingConfig,
    head_steps,
    lr_at,
    new_module,
    target_states,
    target_states_many,
    unrolled_mask,
)
from quickdraft.training.train_log import read_evals

from conftest import tiny_llama, tiny_text_model

WINDOWS = [([3, 1, 4, 1, 5, 9, 2], 2), ([2, 7, 1, 8], 1), ([6, 6, 6, 6, 6], 3)]


def _store(tmp_path, net, layer=1, windows=WINDOWS, **meta):
    return FeatureStore(tmp_path / "store", windows, int(net.embed.shape[1]), layer, {"target": "tiny", **meta})


def test_store_returns_what_the_target_computed_once(tmp_path):
    net = NativeLlama(tiny_llama(vocab=16, layers=2, seed=1, dtype=torch.bfloat16).model)
    store, calls = _store(tmp_path, net), []

    def compute(ids):
        calls.append(list(ids))
        return target_states(net, ids, 1)

    assert store.fill([2, 0, 2], compute) == 2 and store.fill([0, 1], compute) == 1
    assert sorted(map(tuple, calls)) == sorted(tuple(w) for w, _ in WINDOWS)  # each window once
    batch = store.batch([2, 0])
    for b, i in enumerate([2, 0]):
        ids, prompt_len = WINDOWS[i]
        want = target_states(net, ids, 1)
        n = len(ids)
        assert batch.ids[b, :n].tolist() == ids and batch.lengths[b] == n and batch.prompt_lens[b] == prompt_len
        assert torch.equal(batch.feats[b, :n], want[FEATURES]) and torch.equal(batch.shallow[b, :n], want[1])
        assert not batch.feats[b, n:].any()  # padding


def test_batched_fill_equals_the_inference_forward_window_by_window(tmp_path):
    """What a GPU fills the store with (Hugging Face's forward over right-padded chunks of windows)
    is the native inference forward's states, window by window (float64: to rounding)."""
    loaded = tiny_llama(vocab=16, layers=2, seed=1, dtype=torch.float64)
    net = NativeLlama(loaded.model)
    got = target_states_many(loaded.model, [w for w, _ in WINDOWS], 1)
    for (ids, _), states in zip(WINDOWS, got, strict=True):
        want = target_states(net, ids, 1)
        n = len(ids)
        assert torch.allclose(states[FEATURES][:n], want[FEATURES], atol=1e-10)
        assert torch.allclose(states[1][:n], want[1], atol=1e-10)
    store, chunks = _store(tmp_path, net), []

    def many(windows):
        chunks.append(len(windows))
        return target_states_many(loaded.model, windows, 1)

    assert store.fill([2, 0, 1], lambda ids: pytest.fail("the batched path computes"), many, chunk=2) == 3
    assert chunks == [2, 1] and store.coverage == 1.0


def test_a_time_budget_spans_the_schedule():
    cfg = HeadTrainingConfig(steps=10**9, warmup=2, lr=1.0, minutes=1.0)
    assert lr_at(0, cfg, 0.0) == 0.5  # warm-up by steps
    assert lr_at(5, cfg, 0.0) == pytest.approx(1.0) and lr_at(5, cfg, 1.0) == pytest.approx(0.1)
    assert lr_at(5, cfg, 0.5) == pytest.approx(0.55)


def test_store_keeps_only_flushed_windows_and_refuses_other_data(tmp_path):
    net = NativeLlama(tiny_llama(vocab=16, layers=2, seed=1, dtype=torch.bfloat16).model)
    store = _store(tmp_path, net)
    store.fill([0], lambda ids: target_states(net, ids, 1))
    store.flush()
    store.fill([1], lambda ids: target_states(net, ids, 1))  # computed, never flushed: a crash here
    again = _store(tmp_path, net)
    assert again.built.tolist() == [True, False, False] and again.coverage == pytest.approx(1 / 3)
    assert torch.equal(again.batch([0]).feats, store.batch([0]).feats)
    with pytest.raises(QuickdraftError, match="not built"):
        again.batch([1])
    with pytest.raises(QuickdraftError, match="digest"):
        _store(tmp_path, net, windows=WINDOWS[:2])
    with pytest.raises(QuickdraftError, match="max_len"):
        _store(tmp_path, net, max_len=64)
    assert np.load(tmp_path / "store" / "rows.npy").shape == (3, 3)


def test_unrolled_mask_is_what_a_drafting_step_sees():
    m = unrolled_mask(3, 3)
    # step 3, origin 1 (row 2*3 + 1): true rows 0..1, its origin's step-2 row, itself
    assert m[7].nonzero().flatten().tolist() == [0, 1, 4, 7]
    assert m[:3, :3].equal(torch.ones(3, 3, dtype=torch.bool).tril()) and not m[:3, 3:].any()


@pytest.mark.parametrize("broken", [False, True])
def test_unrolled_head_equals_drafting(broken, monkeypatch):
    """Step j of the unrolled head at origin t equals the j-th predicted feature of the drafter
    drafting from context x_0..x_{t+1} (its head cache over true features, then its own rows), fed
    the corpus tokens; a plainly causal mask over the steps (`broken`) must not."""
    target = tiny_llama(vocab=40, layers=2, hidden=32, seed=3, dtype=torch.float64)
    ids = [5, 9, 2, 7, 7, 1, 30, 4, 12, 8]
    owner = NativeCachedModel(target.model)
    feats = owner.forward(ids, features=True).features  # (T, H)
    module = new_module("head", target.model, HeadTrainingConfig(kinds=("head",))).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # not the identity-ish start
    embed, head = target.model.model.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()
    if broken:
        monkeypatch.setattr(
            "quickdraft.training.train_heads.unrolled_mask",
            lambda n, steps, device=None: torch.ones(steps * n, steps * n, dtype=torch.bool).tril(),
        )
    batch = Batch(torch.tensor([ids]), [len(ids)], [1], feats[None], None)
    with torch.no_grad():
        steps = head_steps(module, batch, embed, 3)
    for j, (_, target, _) in enumerate(steps, start=1):  # step j's targets: the features at t + j
        assert torch.equal(target, feats[j:])
    drafter = FeatureHeadDrafter(module, HeadLM(embed, head, 40, None))
    worst = 0.0
    for t in range(len(ids) - 4):
        drafter.begin(ids[: t + 2])
        drafter.observe({-1: feats[: t + 1]})  # features of the committed tokens but the last
        with torch.no_grad():
            pred = drafter._catch_up(ids[: t + 2])  # step 1: predicted f_{t+1}
            worst = max(worst, float((pred[0] - steps[0][0][t]).abs().max()))
            for j in (2, 3):
                pred = drafter._rows(pred, torch.tensor([ids[t + j]]))
                worst = max(worst, float((pred[0] - steps[j - 1][0][t]).abs().max()))
        drafter.kv.rollback(t + 1)
    assert (worst > 1e-6) if broken else (worst < 1e-10), worst


# --- the CLI: a run interrupted and resumed ------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-store")
    model = tiny_text_model(layers=3)
    model.model.save_pretrained(root / "tiny")
    model.tokenizer.save_pretrained(root / "tiny")
    tok = model.tokenizer
    (root / "seqkd").mkdir()
    with gzip.open(root / "seqkd" / "seqkd-mixed-00.jsonl.gz", "wt") as f:
        pairs = [("say abc", "abc abc abc"), ("say hi", "hi hi hi hi"), ("cat?", "the cat sat")] * 4
        for i, (user, reply) in enumerate(pairs):
            row = {"id": f"s{i}", "split": "heldout" if i % 4 >= 2 else "train", "mode": ("greedy", "sample")[i % 2]}
            row.update(prompt_ids=tok.encode(user + "."), response_ids=tok.encode(reply) + [tok.eos_token_id])
            f.write(json.dumps(row) + "\n")
    return root


def _train(corpus, out, *extra):
    return main(
        ["train-draft", "--kind", "head,kangaroo,specdec", "--data", str(corpus / "seqkd"), "--output", str(out),
         "--target", str(corpus / "tiny"), "--steps", "4", "--batch-size", "2", "--max-len", "24",
         "--head-vocab", "16", "--exit-layer", "1", "--block", "2", "--eval-rows", "2", "--decode-prompts", "0",
         "--checkpoint-every", "1", "--eval-every", "2", "--ttt-steps", "2", "--no-progress", *extra]
    )  # fmt: skip


def _weights(out):
    return torch.load(out / "checkpoint.pt", weights_only=False)["modules"]


class Killed(Exception):
    """The process dies mid-run (what the session's end does to a background job)."""


def _interrupted(corpus, out, monkeypatch, at=2):
    real = train_run.TrainRun.train_step

    def crash(self):
        if self.step == at:
            raise Killed
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(train_run.TrainRun, "train_step", crash)
        with pytest.raises(Killed):
            _train(corpus, out)
    assert _train(corpus, out) == 0


@pytest.mark.parametrize("restore", [True, False])
def test_a_resumed_run_equals_an_uninterrupted_one(corpus, tmp_path, monkeypatch, restore):
    assert _train(corpus, tmp_path / "straight") == 0
    if not restore:  # negative control: resuming without the RNG streams changes the block drafter's cuts
        monkeypatch.setattr(train_run, "restore_rng", lambda state: None)
    _interrupted(corpus, tmp_path / "resumed", monkeypatch)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    same = {k: all(torch.equal(a[k][n], b[k][n]) for n in a[k]) for k in a}
    assert same == ({"head": True, "kangaroo": True, "specdec": True} if restore else {**same, "specdec": False})
    if restore:
        report = json.loads((tmp_path / "resumed" / "report.json").read_text())
        assert [r["step"] for r in report["history"]] == [1, 2, 3, 4]
        evals = read_evals(tmp_path / "resumed" / "eval.jsonl")
        assert {(r["kind"], r["step"]) for r in evals} >= {("head", 0), ("head", 2), ("head", 4)}
        last_head = [r for r in evals if r["kind"] == "head"][-1]
        assert "greedy_agreement_2" in last_head["greedy"] and (tmp_path / "resumed" / "eval.png").is_file()
        meta = json.loads((tmp_path / "resumed" / "head" / "draft_head.json").read_text())
        assert meta["positions_seen"] > 0 and meta["sessions"][-1]["throughput"]["cached_positions"] >= 0


def test_init_starts_from_a_trained_module(corpus, tmp_path, capsys):
    assert _train(corpus, tmp_path / "first") == 0
    args = ["train-draft", "--kind", "head", "--data", str(corpus / "seqkd"), "--target", str(corpus / "tiny"),
            "--max-len", "24", "--eval-rows", "2", "--decode-prompts", "1", "--no-progress",
            "--steps", "0"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "again"), "--init", str(tmp_path / "first" / "head")]) == 0
    names = ("draft_head.safetensors", "head_ids.safetensors")
    for name in names:  # nothing trained: the module and its head ids are the ones it started from
        assert (tmp_path / "again" / "head" / name).read_bytes() == (tmp_path / "first" / "head" / name).read_bytes()
    meta = json.loads((tmp_path / "again" / "head" / "draft_head.json").read_text())
    assert [int(b) for b in meta["tree_gain"]] == list(GAIN_BUDGETS)  # measured on the held-out prompt
    assert all(1 <= w <= int(b) for b, w in meta["tree_gain_width"].items())
    assert all(v >= 1.0 for v in meta["tree_gain"].values()) and meta["tree_gain_measured"]["prompts"] == 1
    assert "tree_gain" not in json.loads((tmp_path / "first" / "head" / "draft_head.json").read_text())  # no prompts
    assert main([*args, "--output", str(tmp_path / "bad"), "--init", str(tmp_path / "first" / "kangaroo")]) == 2
    assert "--init" in capsys.readouterr().err


def test_a_quantized_target_fills_the_store_with_the_states_it_drafts_from(corpus, tmp_path):
    """`--quantize w8a8`: the store's features are the quantized target's (what the drafter reads at
    inference under the same flag), named in its meta; the bf16 store's differ (a negative control)."""
    import numpy as np

    assert _train(corpus, tmp_path / "q", "--quantize", "w8a8", "--steps", "1") == 0
    assert _train(corpus, tmp_path / "b", "--steps", "1") == 0
    meta = json.loads((tmp_path / "q" / "store" / "train" / "meta.json").read_text())
    assert meta["weights"] == "w8a8" and "weights" not in json.loads(
        (tmp_path / "b" / "store" / "train" / "meta.json").read_text()
    )
    built = np.load(tmp_path / "q" / "store" / "train" / "built.npy")
    assert built.any()
    q = np.fromfile(tmp_path / "q" / "store" / "train" / "features.bin", dtype=np.int16)
    b = np.fromfile(tmp_path / "b" / "store" / "train" / "features.bin", dtype=np.int16)
    assert q.shape == b.shape and q.any() and not np.array_equal(q, b)


def test_decode_evaluation_runs_the_runs_weights_on_its_held_copy(monkeypatch):
    """`train-draft --quantize`: decode evaluation (and the gain table) run the target on the run's
    weights, sharing the copy the run holds (a 1.5B's bf16 repack per evaluation once ran out of
    memory); without a holder the engine builds its own (a negative control for the count)."""
    import gc

    from quickdraft.runtime.quant import quantized
    from quickdraft.runtime.quant.modes import parse_quantize
    from quickdraft.training.decode_eval import decode_eval
    from quickdraft.training.train_heads import HeadTrainingConfig, new_module

    target = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.bfloat16)
    module = new_module("head", target.model, HeadTrainingConfig())
    built = []
    build = quantized._build
    monkeypatch.setattr(quantized, "_build", lambda *a: built.append(1) or build(*a))
    held = quantized.quantize_model(target, parse_quantize("w8a8"))
    got = decode_eval(module, "head", target, None, [[5, 6, 7, 5, 6, 7]], 12, quantize="w8a8")
    assert got["tokens_per_target_forward"] >= 1.0 and len(built) == 1  # the held copy, shared
    del held
    gc.collect()
    decode_eval(module, "head", target, None, [[5, 6, 7, 5, 6, 7]], 12, quantize="w8a8")
    assert len(built) == 2
