"""Cached distillation data: the stored top-k equals the target's, batches stay aligned, training from it."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.training import DistillConfig, Distiller, Example, make_student
from quickdraft.training.cache import CachedData, CacheSpec, build_cache, topk_divergence
from quickdraft.training.data import Sampled
from quickdraft.training.losses import acceptance, make_divergence
from quickdraft.training.trainer import scored_logits

from conftest import tiny_llama


def _examples(n: int = 10) -> list[Example]:
    g = torch.Generator().manual_seed(5)
    return [
        Example(
            torch.randint(3, 30, (3 + i % 4,), generator=g).tolist(),
            torch.randint(3, 30, (2 + i % 5,), generator=g).tolist(),
        )
        for i in range(n)
    ]


def _build(tmp_path, source="fixed", n=10, top_k=32, name="cache", **kw):
    target = tiny_llama(vocab=32, layers=2, seed=0, eos=None)
    spec = CacheSpec(source=source, max_response_tokens=4, top_k=top_k, shard_size=4, **kw)
    folder = build_cache(target, _examples(n), tmp_path / name, spec, 0, set(), batch_size=3, progress=False)
    return target, folder


def test_cached_rows_are_the_targets_log_probs_at_the_scored_positions(tmp_path):
    target, folder = _build(tmp_path)
    data = CachedData([folder])
    assert len(data) == 10 and data.source == "fixed"
    assert len(list(folder.glob("shard-*.safetensors"))) == 3  # 4 + 4 + 2 examples
    # oracle: recompute the target on the batch the cache serves; the rows must match in order
    batch, ids, logp = data.batch(random.Random(1), 6, pad_id=0)
    with torch.no_grad():
        ref = torch.log_softmax(scored_logits(target.model, batch).float(), -1)  # (N, V)
    assert ids.shape == (batch.num_scored, 32)
    assert torch.allclose(ref.gather(-1, ids), logp, atol=1e-5)
    assert torch.equal(ids[:, 0], ref.argmax(-1))  # sorted: the first column is the target's argmax
    # the references (fixed) are what the batch holds after each prompt
    exs = _examples()
    for b in range(batch.input_ids.shape[0]):
        seq = batch.input_ids[b][batch.attention_mask[b].bool()].tolist()
        assert any(seq == e.prompt + e.response[:4] for e in exs)


def test_target_cache_holds_greedy_generations_and_resumes_missing_shards(tmp_path):
    target, folder = _build(tmp_path, source="target", gen_temperature=0.0)
    data = CachedData([folder])
    ref = Sampled("target", 4, temperature=0.0).make(
        _examples()[:3], 0, target=target.model, draft=None, eos_ids=set(), generator_seed=0
    )
    first = ref.input_ids[0][ref.attention_mask[0].bool()].tolist()
    assert data.sequences[0] == first
    # greedy: each response token is the target's argmax, i.e. column 0 of the cached top-k
    assert data.top_ids[0][:, 0].tolist() == data.sequences[0][data.prompt_lens[0] :]
    before = sorted(p.name for p in folder.glob("shard-*"))
    (folder / before[1]).unlink()
    stamp = (folder / before[0]).stat().st_mtime_ns
    _build(tmp_path, source="target", gen_temperature=0.0)
    assert sorted(p.name for p in folder.glob("shard-*")) == before
    assert (folder / before[0]).stat().st_mtime_ns == stamp  # existing shards are kept, not rebuilt
    assert CachedData([folder]).sequences == data.sequences


def test_a_cache_with_other_options_is_refused(tmp_path):
    _build(tmp_path)
    with pytest.raises(QuickdraftError, match="other options"):
        _build(tmp_path, top_k=8)
    with pytest.raises(QuickdraftError, match="not a distillation cache"):
        CachedData([tmp_path / "nothing"])
    with pytest.raises(QuickdraftError, match="'fixed' or 'target'"):
        _build(tmp_path, source="draft", name="other")
    _build(tmp_path, top_k=8, name="k8")
    with pytest.raises(QuickdraftError, match="different top_k"):
        CachedData([tmp_path / "cache", tmp_path / "k8"])


def _naive(p: list[float], q: list[float]) -> dict[str, float]:
    """FKL, JSD, TVD and acceptance by float64 loops; p may be zero (0 log 0 = 0)."""

    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0)

    def js(beta):
        m = [beta * x + (1 - beta) * y for x, y in zip(p, q, strict=True)]
        return beta * kl(p, m) + (1 - beta) * kl(q, m)

    return {
        "fkl": kl(p, q),
        "jsd": js(0.5),
        "jsd:0.3": js(0.3),
        "tvd": 0.5 * sum(abs(x - y) for x, y in zip(p, q, strict=True)),
        "acc": sum(min(x, y) for x, y in zip(p, q, strict=True)),
    }


@pytest.mark.parametrize("name", ["fkl", "jsd", "jsd:0.3", "tvd"])
def test_topk_divergence_with_the_whole_vocabulary_is_the_divergence(name):
    g = torch.Generator().manual_seed(0)
    V = 50
    p_logits = torch.randn(7, V, generator=g) * 2
    q_logits = torch.randn(7, V, generator=g) * 2
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    div = make_divergence(name)
    top = torch.topk(lp, V, -1)
    loss, acc = topk_divergence(top.indices, top.values, q_logits, name)
    assert float(loss) == pytest.approx(float(div(lp, lq).mean()), rel=1e-4)
    assert float(acc) == pytest.approx(float(acceptance(lp, lq).mean()), rel=1e-4)
    # top-k: p_k is p renormalised over its k best tokens; against a naive float64 loop
    k = 5
    top = torch.topk(lp, k, -1)
    loss, acc = topk_divergence(top.indices, top.values, q_logits, name)
    ref_loss, ref_acc = 0.0, 0.0
    for n in range(7):
        pk = [0.0] * V
        mass = sum(math.exp(float(x)) for x in top.values[n])
        for i, x in zip(top.indices[n].tolist(), top.values[n].tolist(), strict=True):
            pk[i] = math.exp(x) / mass
        ref = _naive(pk, lq[n].double().exp().tolist())
        ref_loss += ref[name] / 7
        ref_acc += ref["acc"] / 7
    assert float(loss) == pytest.approx(ref_loss, rel=1e-4)
    assert float(acc) == pytest.approx(ref_acc, rel=1e-4)
    # the gradient is the dense formula's: p_k spread over the vocabulary, zero elsewhere
    qd = q_logits.clone().requires_grad_(True)
    topk_divergence(top.indices, top.values, qd, name)[0].backward()
    qr = q_logits.clone().requires_grad_(True)
    lp_dense = torch.full_like(lp, float("-inf")).scatter(-1, top.indices, torch.log_softmax(top.values, -1))
    div(lp_dense, torch.log_softmax(qr, -1)).mean().backward()
    assert torch.allclose(qd.grad, qr.grad, atol=1e-6)


def _cached_distiller(tmp_path, folder, steps, **kw) -> Distiller:
    target = tiny_llama(vocab=32, layers=2, seed=0, eos=None)
    cfg = DistillConfig(
        output=str(tmp_path / "run"), steps=steps, batch_size=4, cache=str(folder), checkpoint_every=3, **kw
    )
    return Distiller(target, make_student(target, "truncated:1"), [], cfg)


def test_training_from_a_cache_learns_and_resumes_exactly(tmp_path):
    _, folder = _build(tmp_path, top_k=8)
    d = _cached_distiller(tmp_path / "a", folder, steps=60, lr=2e-2, warmup=1)
    hist = d.train(progress=False)
    assert {r["source"] for r in hist} == {"fixed"}
    first = sum(r["loss"] for r in hist[:5]) / 5
    last = sum(r["loss"] for r in hist[-5:]) / 5
    assert last < 0.5 * first
    assert d.target.model.model.layers[0].mlp.up_proj.weight.grad is None  # no target forward or backward
    straight = _cached_distiller(tmp_path / "b", folder, steps=6)
    straight.train(progress=False)
    _cached_distiller(tmp_path / "c", folder, steps=3).train(progress=False)
    resumed = _cached_distiller(tmp_path / "c", folder, steps=6)
    assert [r["step"] for r in resumed.train(progress=False)] == [4, 5, 6]
    for (n, a), (_, b) in zip(
        straight.student.model.named_parameters(), resumed.student.model.named_parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), n
    with pytest.raises(QuickdraftError, match="infinite"):
        _cached_distiller(tmp_path / "d", folder, steps=2, divergence="rkl")


def test_cli_distill_data_then_train_from_it(tiny_model_dir, tmp_path, capsys):
    from test_distill import _sharegpt_file

    from quickdraft.cli import main

    data = _sharegpt_file(tmp_path)
    cache = tmp_path / "cache"
    base = ["distill-data", "--target", tiny_model_dir, "--data", data, "--output", str(cache), "--no-progress"]
    assert main([*base, "--examples", "6", "--shard-size", "4", "--max-response-tokens", "5", "--top-k", "4"]) == 0
    assert "6 sequences" in capsys.readouterr().out
    spec = json.loads((cache / "cache.json").read_text())["spec"]
    assert spec["source"] == "target" and spec["gen_temperature"] == 0.0 and spec["top_k"] == 4
    run = tmp_path / "run"
    train = ["distill", "--target", tiny_model_dir, "--output", str(run), "--cache", str(cache), "--no-progress"]
    assert main([*train, "--init", "truncated:1", "--steps", "2", "--batch-size", "3", "--draft-vocab", "5"]) == 0
    meta = json.loads((run / "delta" / "distilled.json").read_text())
    assert meta["head_vocab"] == 5
    from safetensors.torch import load_file

    from quickdraft.training.student import rank_tokens
    from quickdraft.weights.loading import load_model

    eos = sorted(load_model(tiny_model_dir, "float32").eos_token_ids)
    cached = CachedData([cache])
    want = rank_tokens([s[p:] for s, p in zip(cached.sequences, cached.prompt_lens, strict=True)], eos)[:5]
    head = load_file(str(run / "delta" / "head_ids.safetensors"))["head_ids"]
    assert head.tolist() == want.tolist() and head[: len(eos)].tolist() == eos  # EOS first, then by frequency
    assert main([*base, "--examples", "6", "--top-k", "8"]) == 2  # other options, same folder
    assert "other options" in capsys.readouterr().err
    # held-out agreement on greedy target text (what greedy SD sees)
    evaluate = ["distill-eval", "--target", tiny_model_dir, "--data", data, "--examples", "3", "--sources", "target"]
    out = tmp_path / "eval.json"
    assert (
        main([*evaluate, "--gen-temperature", "0", "--drafter", f"distilled:{run / 'delta'}", "--json", str(out)]) == 0
    )
    row = json.loads(out.read_text())[0]["target"]
    assert row["tokens"] > 0 and 0 <= row["greedy_agreement"] <= 1
