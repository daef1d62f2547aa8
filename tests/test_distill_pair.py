"""DistillSpec for an independent draft model (the Qwen 0.5B toward its 1.5B): the target's own greedy
outputs as a top-1 cache, a restricted head trained as it drafts, only the last layers trained, and the
delta drafting on the native fast path."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.errors import QuickdraftError
from quickdraft.training.cache import CachedData, topk_divergence
from quickdraft.training.losses import restrict_top
from quickdraft.training.student import make_student, model_init, save_delta
from quickdraft.weights.delta import load_delta


def _corpus(folder, rows) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "seqkd-greedy-00000.jsonl.gz", "wt") as f:
        for i, (split, mode, prompt, response) in enumerate(rows):
            row = {"id": str(i), "split": split, "mode": mode, "prompt_ids": prompt, "response_ids": response}
            f.write(json.dumps(row) + "\n")


def test_the_targets_greedy_outputs_are_a_top1_cache_and_fkl_on_them_is_cross_entropy(tmp_path):
    _corpus(
        tmp_path / "c",
        [
            ("train", "greedy", [1, 2, 3], [4, 5, 6, 7]),
            ("train", "sample", [1, 2], [9, 9]),  # sampled: not the greedy law
            ("heldout", "greedy", [3, 2], [8, 8]),  # held out: never trained on
            ("train", "greedy", [5], [6, 2]),
        ],
    )
    data = CachedData([tmp_path / "c"])
    assert data.sequences == [[1, 2, 3, 4, 5, 6, 7], [5, 6, 2]] and data.prompt_lens == [3, 1]
    assert data.top_ids[0][:, 0].tolist() == [4, 5, 6, 7] and data.top_ids[1][:, 0].tolist() == [6, 2]
    assert all(float(t.abs().sum()) == 0 for t in data.top_logp) and data.source == "target"
    import random

    batch, ids, logp = data.batch(random.Random(0), 3, pad_id=0)
    assert ids.shape == (batch.num_scored, 1)
    scored = batch.input_ids[:, 1:][batch.loss_mask[:, :-1]]  # the token after each scored position
    assert scored.tolist() == ids[:, 0].tolist()
    q = torch.randn(ids.shape[0], 12, generator=torch.Generator().manual_seed(0))
    loss, acc = topk_divergence(ids, logp, q, "fkl")
    ce = torch.nn.functional.cross_entropy(q, ids[:, 0])
    assert float(loss) == pytest.approx(float(ce), rel=1e-5)
    assert float(acc) == pytest.approx(float(torch.softmax(q, -1).gather(-1, ids).mean()), rel=1e-5)


def test_a_restricted_head_trains_on_the_targets_law_over_its_own_ids():
    """restrict_top maps ids to head rows, drops the mass off the head and rows with none; the divergence
    is then against p renormalised over the head's ids, with q's softmax over the head alone."""
    head = torch.tensor([7, 2, 5])  # head row 0 is id 7, row 1 id 2, row 2 id 5
    top_ids = torch.tensor([[2, 3, 7], [3, 4, 0], [5, 2, 1]])
    top_logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]))
    ids, logp, keep = restrict_top(top_ids, top_logp, head, vocab=10)
    assert keep.tolist() == [True, False, True]
    assert ids.tolist() == [[1, 0, 0], [2, 1, 0]]
    assert torch.isinf(logp[0, 1]) and torch.isinf(logp[1, 2]) and not torch.isinf(logp[0, 2])
    q = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    for name in ("fkl", "tvd", "jsd"):
        loss, acc = topk_divergence(ids, logp, q, name)
        assert math.isfinite(float(loss)), name
    loss, acc = topk_divergence(ids, logp, q, "fkl")
    lq = torch.log_softmax(q.double(), -1)
    p0 = torch.tensor([0.5, 0.2], dtype=torch.float64) / 0.7  # ids 2 and 7: head rows 1 and 0
    p1 = torch.tensor([0.7, 0.2], dtype=torch.float64) / 0.9  # ids 5 and 2: rows 2 and 1
    ref = (p0 * (p0.log() - lq[0, [1, 0]])).sum() + (p1 * (p1.log() - lq[1, [2, 1]])).sum()
    assert float(loss) == pytest.approx(float(ref) / 2, rel=1e-5)
    ref_acc = torch.minimum(p0, lq[0, [1, 0]].exp()).sum() + torch.minimum(p1, lq[1, [2, 1]].exp()).sum()
    assert float(acc) == pytest.approx(float(ref_acc) / 2, rel=1e-5)
    # negative control: the same rows unrestricted (q over the whole vocabulary) give another loss
    wide = torch.randn(2, 10, generator=torch.Generator().manual_seed(1))
    assert float(topk_divergence(top_ids[keep], top_logp[keep], wide, "fkl")[0]) != pytest.approx(float(loss))


def test_a_model_student_with_train_n_trains_its_last_layers_and_its_delta_holds_only_them(tiny_model_dir, tmp_path):
    from quickdraft.weights.loading import load_model

    assert model_init("model:qwen2.5-coder-0.5b;train=4") == ("qwen2.5-coder-0.5b", 4)
    assert model_init("model:/a/b") == ("/a/b", None)
    for bad in ("model:x;train=a", "model:x;layers=2", "model:;train=1"):
        with pytest.raises(QuickdraftError):
            model_init(bad)
    target = load_model(tiny_model_dir, "float32")
    layers = int(target.model.config.num_hidden_layers)
    with pytest.raises(QuickdraftError, match="train=N"):
        make_student(target, f"model:{tiny_model_dir};train={layers + 1}")
    student = make_student(target, f"model:{tiny_model_dir};train=1")
    last = f"model.layers.{layers - 1}."
    assert student.trainable and all(n.startswith(last) or n == "model.norm.weight" for n in student.trainable)
    with torch.no_grad():
        for n, p in student.model.named_parameters():
            if n in student.trainable:
                p.add_(0.01 * torch.randn_like(p))
    folder = save_delta(student, tmp_path / "delta", {"target": "tiny"}, dtype=torch.float32)
    assert json.loads((folder / "distilled.json").read_text())["init"] == f"model:{tiny_model_dir};train=1"
    draft = load_delta(target, folder)
    assert draft.trained == frozenset(student.trainable)
    trained = dict(student.model.named_parameters())
    for n, p in draft.model.named_parameters():
        assert torch.equal(p, trained[n].detach()), n
    base = dict(load_model(tiny_model_dir, "float32").model.named_parameters())
    assert not torch.equal(base[f"{last}mlp.up_proj.weight"], trained[f"{last}mlp.up_proj.weight"])  # it moved


def test_a_model_born_delta_drafts_quantized_through_a_window_and_stays_lossless(tiny_model_dir, tmp_path):
    from quickdraft.drafters.draft_models.model_drafter import PMIN, ModelDrafter
    from quickdraft.weights.loading import load_model

    target = load_model(tiny_model_dir, "float32")
    student = make_student(target, f"model:{tiny_model_dir};train=1")
    folder = save_delta(student, tmp_path / "delta", {"target": "tiny"}, dtype=torch.float32)
    stop = StopConfig(24, target.eos_token_ids)
    ids = target.tokenizer("abc de abc de abc")["input_ids"]
    ar = Engine(target, EngineConfig(method="ar")).generate_ids(ids, SamplingConfig(), stop)
    for spec in (f"distilled:{folder};quant=w8a8;window=8", f"distilled:{folder}"):
        engine = Engine(target, EngineConfig(method="sd", drafter=spec))
        out = engine.generate_ids(ids, SamplingConfig(), stop)
        assert out.token_ids == ar.token_ids and out.stats.num_draft_tokens > 0, spec
    drafter = Engine(target, EngineConfig(method="sd", drafter=f"distilled:{folder};quant=w8a8;window=8")).drafter
    found = drafter if isinstance(drafter, ModelDrafter) else None
    assert found is not None and found.weights is not None and found.window.size == 8
    assert found.pmin == PMIN  # a draft model's delta drafts p-min chains by default, as `model:` does
    truncated = make_student(target, "truncated:1")  # a copy of the target's first layer: no p-min
    tfolder = save_delta(truncated, tmp_path / "tdelta", {"target": "tiny"}, dtype=torch.float32)
    assert Engine(target, EngineConfig(method="sd", drafter=f"distilled:{tfolder}")).drafter.pmin is None
    with pytest.raises(QuickdraftError, match="bad option"):
        Engine(target, EngineConfig(method="sd", drafter=f"distilled:{folder};vocab=4"))


def test_quantizing_a_distilled_gguf_born_draft_reads_its_trained_tensors(monkeypatch, tiny_model_dir, tmp_path):
    """A delta's layers replace its base's GGUF blocks: w4a8 quantizes those from the trained values and
    the rest from the file (never the stale blocks), and `gguf` (blocks as stored) is refused."""
    import dataclasses

    from quickdraft.runtime.quant import float_source, quantized
    from quickdraft.runtime.quant.modes import QuantSpec
    from quickdraft.weights.loading import load_model

    loaded = load_model(tiny_model_dir, "float32")
    loaded.model.to(torch.bfloat16)
    name = "model.layers.0.mlp.up_proj.weight"
    other = "model.layers.0.mlp.down_proj.weight"
    file_values = {n: torch.full(p.shape, 0.5) for n, p in loaded.model.named_parameters()}

    def file_value(name, rows=None):
        return file_values[name] if rows is None else file_values[name][rows]

    monkeypatch.setattr(float_source, "gguf_float_reader", lambda path, config, decoders=None: file_value)
    gguf = dataclasses.replace(loaded, gguf=tmp_path / "x.gguf", source=None, trained=frozenset({name}))
    read, source = float_source.float32_source(gguf)
    params = dict(loaded.model.named_parameters())
    assert torch.equal(read(name), params[name].float()) and torch.equal(read(other), file_values[other])
    assert "1 trained tensors" in source
    untrained = dataclasses.replace(gguf, trained=frozenset())
    assert torch.equal(float_source.float32_source(untrained)[0](name), file_values[name])  # negative control
    with pytest.raises(QuickdraftError, match="trained layers"):
        quantized._build(gguf, QuantSpec("gguf"), {})


def test_a_restricted_head_always_holds_the_targets_eos(tiny_model_dir, tmp_path):
    """A ranking of another model's answers can lack the target's end-of-turn id: the head adds it (else
    the draft could never propose the end of an answer); negative control: the ranking alone lacks it."""
    from safetensors.torch import save_file

    from quickdraft.drafters.draft_models.vocab import ranked_ids, restricted_head
    from quickdraft.weights.loading import load_model

    target = load_model(tiny_model_dir, "float32")
    eos = set(target.eos_token_ids)
    ranking = torch.tensor([t for t in range(target.vocab_size) if t not in eos][:10])
    save_file({"ranked": ranking}, str(tmp_path / "ranked.safetensors"))
    path = str(tmp_path / "ranked.safetensors")
    assert not eos & set(ranked_ids(target.name, path)[:5].tolist())
    head = restricted_head(target, path)
    assert eos <= set(head.tolist()) and set(ranking.tolist()) <= set(head.tolist())
    assert head.tolist() == sorted(head.tolist()) and len(head) == len(ranking) + len(eos)


def test_a_distilled_head_is_filled_to_k_from_the_targets_shipped_ranking(monkeypatch, tiny_model_dir, tmp_path):
    from quickdraft.drafters.draft_models import vocab
    from quickdraft.training import DistillConfig, Distiller
    from quickdraft.weights.loading import load_model

    _corpus(tmp_path / "c", [("train", "greedy", [1, 2], [4, 5, 4]), ("train", "greedy", [3], [6, 4])])
    target = load_model(tiny_model_dir, "float32")
    ranking = torch.tensor([9, 4, 8, 7, 6, 10, 11])
    monkeypatch.setattr(vocab, "ranked_ids", lambda name, value: ranking)
    cfg = DistillConfig(output=str(tmp_path / "run"), cache=str(tmp_path / "c"), draft_vocab=7, restrict_head=True)
    student = make_student(target, f"model:{tiny_model_dir};train=1")
    monkeypatch.setattr(vocab, "VOCAB_FOR", {})  # negative control: no shipped ranking, the corpus's ids alone
    alone = Distiller(target, student, [], cfg).head_ids.tolist()
    eos = sorted(target.eos_token_ids)
    assert alone == [*eos, 4, 5, 6]
    monkeypatch.setattr(vocab, "VOCAB_FOR", {target.name: "x"})
    filled = Distiller(target, student, [], cfg).head_ids.tolist()
    assert filled == [*alone, *[t for t in ranking.tolist() if t not in alone][: 7 - len(alone)]]
