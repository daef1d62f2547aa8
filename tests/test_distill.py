"""DistillSpec: losses against naive references, data generators, trainer, checkpoints, shipped delta."""

from __future__ import annotations

import json
import math

import pytest
import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.engine import Engine, EngineConfig
from quickdraft.errors import QuickdraftError
from quickdraft.training import (
    DistillConfig,
    Distiller,
    Example,
    LossProcessing,
    acceptance,
    distill_loss,
    fkl,
    jsd,
    load_delta,
    make_divergence,
    make_student,
    parse_mix,
    rkl,
    save_delta,
    tvd,
)
from quickdraft.training.data import FixedData, Sampled, collate, encode_chat, first_turn, iter_sharegpt
from quickdraft.training.losses import processed_logprobs

from conftest import tiny_llama, tiny_text_model

# ---- losses against naive float64 loops ------------------------------------------------------


def _naive(p: list[float], q: list[float]) -> dict[str, float]:
    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b, strict=False) if x > 0)

    m = [0.5 * x + 0.5 * y for x, y in zip(p, q, strict=False)]
    m3 = [0.3 * x + 0.7 * y for x, y in zip(p, q, strict=False)]
    return {
        "fkl": kl(p, q),
        "rkl": kl(q, p),
        "jsd": 0.5 * kl(p, m) + 0.5 * kl(q, m),
        "jsd:0.3": 0.3 * kl(p, m3) + 0.7 * kl(q, m3),
        "tvd": 0.5 * sum(abs(x - y) for x, y in zip(p, q, strict=False)),
        "acc": sum(min(x, y) for x, y in zip(p, q, strict=False)),
    }


@pytest.mark.parametrize("V", [2, 7, 1000])
def test_each_divergence_matches_a_naive_reference(V):
    g = torch.Generator().manual_seed(V)
    lp = torch.log_softmax(3 * torch.randn(5, V, generator=g, dtype=torch.float64), -1)
    lq = torch.log_softmax(3 * torch.randn(5, V, generator=g, dtype=torch.float64), -1)
    for row in range(5):
        ref = _naive(lp[row].exp().tolist(), lq[row].exp().tolist())
        for name in ("fkl", "rkl", "jsd", "jsd:0.3", "tvd"):
            got = float(make_divergence(name)(lp[row : row + 1], lq[row : row + 1])[0])
            assert got == pytest.approx(ref[name], rel=1e-9, abs=1e-12), name
        assert float(acceptance(lp[row : row + 1], lq[row : row + 1])[0]) == pytest.approx(ref["acc"], rel=1e-9)


def test_tvd_is_summed_over_the_vocabulary_not_averaged():
    # disjoint supports: TVD = 1 whatever the vocabulary size (a mean over V would give 2/V)
    V = 50_000
    lp = torch.full((1, V), float("-inf"))
    lq = torch.full((1, V), float("-inf"))
    lp[0, 0] = 0.0
    lq[0, 1] = 0.0
    assert float(tvd(lp, lq)[0]) == pytest.approx(1.0)
    assert float(acceptance(lp, lq)[0]) == 0.0


def test_forward_and_reverse_kl_are_named_by_formula():
    p = torch.tensor([[0.9, 0.1]]).log()
    q = torch.tensor([[0.5, 0.5]]).log()
    kl_pq = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    kl_qp = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(fkl(p, q)[0]) == pytest.approx(kl_pq)
    assert float(rkl(p, q)[0]) == pytest.approx(kl_qp)
    assert float(jsd(p, p)[0]) == pytest.approx(0.0, abs=1e-7)
    assert float(jsd(p, q)[0]) <= math.log(2)


def test_unknown_or_bad_divergences_are_refused():
    for bad in ("kl", "jsd:1.5", "jsd:x", "tvd:2"):
        with pytest.raises(QuickdraftError):
            make_divergence(bad)


def test_one_parser_reads_a_divergence_for_both_trainers():
    """The live trainer and the cached top-k trainer read the spec through one parser
    (`losses.parse_divergence`): the same names, betas and errors; the cache refuses only rkl."""
    from quickdraft.training.cache import parse_topk_divergence
    from quickdraft.training.losses import parse_divergence

    assert parse_divergence("jsd:0.9") == parse_topk_divergence("jsd:0.9") == ("jsd", 0.9)
    assert parse_divergence("jsd") == ("jsd", 0.5) and parse_divergence("tvd") == ("tvd", 0.5)
    for bad in ("jsd:1.5", "jsd:x", "kl"):
        for parse in (parse_divergence, parse_topk_divergence):
            with pytest.raises(QuickdraftError, match="jsd beta|unknown divergence"):
                parse(bad)
    assert parse_divergence("rkl") == ("rkl", 0.5)
    with pytest.raises(QuickdraftError, match="cached top k"):
        parse_topk_divergence("rkl")


def test_loss_uses_the_same_processing_for_p_and_q():
    g = torch.Generator().manual_seed(0)
    p_logits = torch.randn(6, 30, generator=g)
    q_logits = torch.randn(6, 30, generator=g)
    proc = LossProcessing(temperature=0.5, top_k=5)
    lp, lq = processed_logprobs(p_logits, proc), processed_logprobs(q_logits, proc)
    assert torch.isfinite(lp).sum(-1).eq(5).all() and torch.isfinite(lq).sum(-1).eq(5).all()
    mask = torch.ones(6, dtype=torch.bool)
    _, acc = distill_loss(p_logits, q_logits, mask, tvd, proc)
    expected = torch.minimum(lp.exp(), lq.exp()).sum(-1).mean()
    assert float(acc) == pytest.approx(float(expected), rel=1e-6)
    # the processed acceptance is the one speculative sampling sees with the same sampling config
    from quickdraft.sampling import logits_to_probs

    cfg = SamplingConfig(temperature=0.5, top_k=5)
    sd = torch.minimum(logits_to_probs(p_logits, cfg), logits_to_probs(q_logits, cfg)).sum(-1).mean()
    assert float(acc) == pytest.approx(float(sd), rel=1e-5)


def test_loss_slices_a_padded_vocabulary_tail():
    p = torch.randn(4, 10)
    q = torch.cat([p, torch.full((4, 3), 50.0)], -1)  # padded rows the target cannot produce
    loss, acc = distill_loss(p, q, torch.ones(4, dtype=torch.bool), fkl, LossProcessing())
    assert float(loss) == pytest.approx(0.0, abs=1e-5) and float(acc) == pytest.approx(1.0, abs=1e-5)


# ---- data -----------------------------------------------------------------------------------


def test_sharegpt_reader_stops_at_a_truncated_tail(tmp_path):
    recs = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "x"}]},
    ]
    text = "[" + ",\n".join(json.dumps(r) for r in recs) + ', {"id": "c", "conversa'
    f = tmp_path / "sg.json"
    f.write_text(text)
    got = list(iter_sharegpt(f))
    assert [r["id"] for r in got] == ["a", "b"]
    assert first_turn(got[0]) == ("hi", "hello") and first_turn(got[1]) is None


def test_encode_chat_splits_prompt_and_response():
    m = tiny_text_model()
    ex = encode_chat(m.tokenizer, "ab", "cd")
    assert m.tokenizer.decode(ex.prompt) == "ab." and m.tokenizer.decode(ex.response) == "cd."


def test_collate_left_pads_and_scores_response_positions():
    fixed = FixedData(max_response_tokens=2)
    b = fixed.make([Example([5, 6], [7, 8, 9]), Example([5], [7])], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [0, 0, 5, 7]]
    # position t is scored when it predicts a response token (t+1 in the response)
    assert b.loss_mask.tolist() == [[False, True, True, False], [False, False, True, False]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]


def test_mix_parsing():
    assert parse_mix("fixed=0.5,draft=0.5") == {"fixed": 0.5, "draft": 0.5}
    assert parse_mix("target") == {"target": 1.0}
    for bad in ("web=1", "fixed=-1", "fixed=0", "draft=x"):
        with pytest.raises(QuickdraftError):
            parse_mix(bad)


def _examples(n: int = 12) -> list[Example]:
    g = torch.Generator().manual_seed(3)
    return [
        Example(
            torch.randint(3, 30, (4 + i % 3,), generator=g).tolist(), torch.randint(3, 30, (6,), generator=g).tolist()
        )
        for i in range(n)
    ]


def test_on_policy_data_comes_from_the_draft_without_gradient():
    target, draft = tiny_llama(vocab=32, seed=0), make_student(tiny_llama(vocab=32, seed=0), "truncated:1")
    exs = _examples(4)
    gen = Sampled("draft", max_response_tokens=5)
    b = gen.make(exs, 0, target=target.model, draft=draft.model, eos_ids=set(), generator_seed=7)
    assert not b.input_ids.requires_grad
    assert all(p.grad is None for p in draft.model.parameters())
    assert draft.model.training  # restored after sampling in eval mode
    # the same seed with the draft's own generate() gives the same responses; the target's differ
    prompts = collate([e.prompt for e in exs], [[False] * len(e.prompt) for e in exs], 0, "")
    with torch.no_grad():
        draft.model.eval()
        torch.manual_seed(7)
        ref = draft.model.generate(
            input_ids=prompts.input_ids,
            attention_mask=prompts.attention_mask,
            do_sample=True,
            top_k=0,
            max_new_tokens=5,
            pad_token_id=0,
        )
        draft.model.train()
    P = prompts.input_ids.shape[1]
    assert b.input_ids[:, -5:].tolist() == ref[:, P:].tolist()
    other = Sampled("target", 5).make(exs, 0, target=target.model, draft=draft.model, eos_ids=set(), generator_seed=7)
    assert other.input_ids[:, -5:].tolist() != b.input_ids[:, -5:].tolist()
    assert b.loss_mask.sum() == 4 * 5


def test_sampled_responses_stop_at_eos():
    target = tiny_llama(vocab=32, seed=0, eos=None)
    b = Sampled("target", 20).make(
        _examples(3), 0, target=target.model, draft=None, eos_ids={4, 5, 6, 7}, generator_seed=0
    )
    for row, mask in zip(b.input_ids.tolist(), b.loss_mask.tolist(), strict=False):
        scored = [t for t, m in enumerate(mask) if m]
        resp = row[scored[0] + 1 : scored[-1] + 2]
        assert all(t not in {4, 5, 6, 7} for t in resp[:-1])


# ---- trainer ---------------------------------------------------------------------------------


def _distiller(tmp_path, steps=4, **kw) -> Distiller:
    target = tiny_llama(vocab=32, layers=3, seed=0)
    student = make_student(target, kw.pop("init", "truncated:1"))
    cfg = DistillConfig(output=str(tmp_path / "run"), steps=steps, batch_size=4, max_response_tokens=6, **kw)
    return Distiller(target, student, _examples(), cfg)


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "jsd", "tvd"])
def test_one_batch_overfits(tmp_path, divergence):
    d = _distiller(
        tmp_path,
        steps=150,
        divergence=divergence,
        lr=3e-2,
        warmup=1,
        mix="fixed",
        init="small:layers=1,hidden=32,heads=2,kv_heads=1",
    )
    batch = d.make_batch(0)
    first_loss, first_acc = d.train_step(batch)
    for _ in range(149):
        loss, acc = d.train_step(batch)
    assert loss < 0.15 * first_loss
    assert acc > 0.9 > first_acc


def test_only_the_draft_trains_and_truncated_embeddings_stay_frozen(tmp_path):
    d = _distiller(tmp_path, mix="fixed=1,target=1,draft=1")
    before_t = {k: v.clone() for k, v in d.target.model.state_dict().items()}
    emb = d.student.model.get_input_embeddings().weight.clone()
    layer = d.student.model.model.layers[0].mlp.up_proj.weight.clone()
    d.train(progress=False)
    assert all(torch.equal(before_t[k], v) for k, v in d.target.model.state_dict().items())
    assert torch.equal(emb, d.student.model.get_input_embeddings().weight)
    assert not torch.equal(layer, d.student.model.model.layers[0].mlp.up_proj.weight)
    assert "model.embed_tokens.weight" not in d.student.trainable


def test_trainer_end_to_end_checkpoints_and_resumes_exactly(tmp_path):
    straight = _distiller(tmp_path / "a", steps=6, mix="fixed=1,target=1,draft=1", checkpoint_every=3)
    hist = straight.train(progress=False)
    assert [r["step"] for r in hist] == [1, 2, 3, 4, 5, 6]
    assert {r["source"] for r in hist} <= {"fixed", "target", "draft"}
    assert all(0 <= r["expected_acceptance"] <= 1 and r["tokens"] > 0 for r in hist)

    first = _distiller(tmp_path / "b", steps=3, mix="fixed=1,target=1,draft=1", checkpoint_every=3)
    first.train(progress=False)
    with open(tmp_path / "b" / "run" / "history.jsonl", "a") as f:  # a step done after the checkpoint, then a crash
        f.write(json.dumps({"step": 4, "loss": 0.0}) + "\n")
    resumed = _distiller(tmp_path / "b", steps=6, mix="fixed=1,target=1,draft=1", checkpoint_every=3)
    assert [r["step"] for r in resumed.train(progress=False)] == [4, 5, 6]
    for (n, a), (_, b) in zip(
        straight.student.model.named_parameters(), resumed.student.model.named_parameters(), strict=False
    ):
        assert torch.allclose(a, b, atol=1e-6), n

    # the checkpoint is an ordinary HF folder; history has one line per step of both runs
    from transformers import AutoModelForCausalLM

    ck = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "run" / "checkpoint")
    assert torch.allclose(
        ck.model.layers[0].mlp.up_proj.weight, resumed.student.model.model.layers[0].mlp.up_proj.weight
    )
    lines = (tmp_path / "b" / "run" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # the lost step 4 is not kept twice
    # a changed run is refused instead of silently mixing two configurations
    with pytest.raises(QuickdraftError, match="divergence"):
        _distiller(tmp_path / "b", steps=8, mix="fixed=1,target=1,draft=1", divergence="rkl").train(progress=False)


def test_distilled_delta_round_trip_and_lossless_sd(tmp_path):
    target = tiny_text_model()
    d = Distiller(
        target,
        make_student(target, "truncated:1"),
        [encode_chat(target.tokenizer, "abc de", "fgh ij"), encode_chat(target.tokenizer, "hello", "world")],
        DistillConfig(output=str(tmp_path / "run"), steps=3, batch_size=2, max_response_tokens=5, mix="fixed"),
    )
    d.train(progress=False)
    folder = save_delta(d.student, tmp_path / "delta", {"target": "tiny"}, dtype=torch.float32)
    draft = load_delta(target, folder)
    for n, p in draft.model.named_parameters():
        assert torch.equal(p, dict(d.student.model.named_parameters())[n].detach()), n
    # greedy SD with the distilled draft equals plain decoding, and it did speculate
    stop = StopConfig(24, target.eos_token_ids)
    ids = target.tokenizer("abc de")["input_ids"]
    ar = Engine(target, EngineConfig(method="ar")).generate_ids(ids, SamplingConfig(), stop)
    sd = Engine(target, EngineConfig(method="sd", drafter=f"distilled:{folder}")).generate_ids(
        ids, SamplingConfig(), stop
    )
    assert sd.token_ids == ar.token_ids
    assert sd.stats.num_draft_tokens > 0


def test_a_delta_for_another_target_is_refused(tmp_path):
    small = make_student(tiny_llama(vocab=32, layers=3, hidden=32), "truncated:1")
    folder = save_delta(small, tmp_path / "delta", {})
    with pytest.raises(QuickdraftError, match="another target"):
        load_delta(tiny_llama(vocab=40, layers=3, hidden=32), folder)
    with pytest.raises(QuickdraftError, match="no distilled draft"):
        load_delta(tiny_llama(vocab=32), tmp_path)


def test_a_model_born_student_ships_as_a_delta_naming_its_base(tiny_model_dir, tmp_path):
    """DistillSpec with an independent draft model (the Qwen 0.5B beside its 1.5B): the delta names
    its base (`model:PATH`), holds only the trained layers (the embedding and head stay frozen), and
    loads back onto that base exactly; SD with it equals plain decoding and speculates."""
    from quickdraft.weights.loading import load_model

    target = load_model(tiny_model_dir, "float32")
    student = make_student(target, f"model:{tiny_model_dir}")
    frozen = {"model.embed_tokens.weight", "lm_head.weight"}
    assert student.trainable and not frozen & set(student.trainable)
    with torch.no_grad():  # stands for training: every trainable tensor moves
        for n, p in student.model.named_parameters():
            if n in student.trainable:
                p.add_(0.01 * torch.randn_like(p))
    folder = save_delta(student, tmp_path / "delta", {"target": "tiny"}, dtype=torch.float32)
    meta = json.loads((folder / "distilled.json").read_text())
    assert meta["init"] == f"model:{tiny_model_dir}"
    draft = load_delta(target, folder)
    trained = dict(student.model.named_parameters())
    for n, p in draft.model.named_parameters():
        assert torch.equal(p, trained[n].detach()), n
    stop = StopConfig(16, target.eos_token_ids)
    ids = target.tokenizer("abc de")["input_ids"]
    ar = Engine(target, EngineConfig(method="ar")).generate_ids(ids, SamplingConfig(), stop)
    sd = Engine(target, EngineConfig(method="sd", drafter=f"distilled:{folder}")).generate_ids(
        ids, SamplingConfig(), stop
    )
    assert sd.token_ids == ar.token_ids and sd.stats.num_draft_tokens > 0
    meta["hidden_size"] += 1  # negative control: a delta for another base is refused
    (folder / "distilled.json").write_text(json.dumps(meta))
    with pytest.raises(QuickdraftError, match="another base than model:"):
        load_delta(target, folder)
    with pytest.raises(QuickdraftError, match="model:NAME"):
        make_student(target, "model:")


def _sharegpt_file(tmp_path, n=300):
    import random

    rng = random.Random(0)
    words = ["abc", "hello", "the cat", "sat", "on", "a mat", "dog", "runs"]
    recs = []
    for i in range(n):
        q = " ".join(rng.choice(words) for _ in range(3))
        a = " ".join(rng.choice(words) for _ in range(6))
        recs.append({"id": f"r{i}", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(recs))
    return str(path)


def test_cli_distill_resumes_and_evaluates(tiny_model_dir, tmp_path, capsys):
    from quickdraft.cli import main

    data = _sharegpt_file(tmp_path)
    out = tmp_path / "run"
    base = [
        "distill",
        "--target",
        tiny_model_dir,
        "--data",
        data,
        "--output",
        str(out),
        "--init",
        "truncated:1",
        "--batch-size",
        "4",
        "--max-response-tokens",
        "8",
        "--checkpoint-every",
        "2",
        "--no-progress",
    ]
    assert main([*base, "--steps", "2"]) == 0
    assert main([*base, "--steps", "4"]) == 0  # resumes at step 2
    lines = (out / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    meta = json.loads((out / "delta" / "distilled.json").read_text())
    assert meta["num_layers"] == 1 and "--steps 4" in meta["command"]
    assert main([*base, "--steps", "6", "--divergence", "tvd"]) == 2
    assert "different divergence" in capsys.readouterr().err
    evaluate = ["distill-eval", "--target", tiny_model_dir, "--data", data]
    rc = main(
        [
            *evaluate,
            "--examples",
            "4",
            "--drafter",
            "truncated:1",
            "--drafter",
            f"distilled:{out / 'delta'}",
            "--json",
            str(tmp_path / "eval.json"),
        ]
    )
    assert rc == 0
    res = json.loads((tmp_path / "eval.json").read_text())
    assert [r["drafter"] for r in res] == ["truncated:1", f"distilled:{out / 'delta'}"]
    assert all(0 <= r[s]["expected_acceptance"] <= 1 and r[s]["tokens"] > 0 for r in res for s in ("fixed", "target"))
    rc = main(
        [
            *evaluate,
            "--examples",
            "3",
            "--drafter",
            "ngram",
            "--write-prompts",
            str(tmp_path / "p.jsonl"),
        ]
    )
    assert rc == 0 and len((tmp_path / "p.jsonl").read_text().splitlines()) == 3
    assert main(["distill", "--target", tiny_model_dir, "--data", data, "--output", str(out), "--mix", "web=1"]) == 2


def test_no_shipped_draft_for_other_targets_is_a_clear_error():
    from quickdraft.drafters import make_drafter

    with pytest.raises(QuickdraftError, match="no distilled draft ships"):
        make_drafter("distilled", tiny_llama(vocab=32))


def test_a_delta_with_a_restricted_head_drafts_only_its_tokens_and_stays_lossless(tmp_path):
    from quickdraft.training.student import rank_tokens

    assert rank_tokens([[5, 5, 3], [3, 7, 5]], always=[9]).tolist() == [9, 5, 3, 7]
    target = tiny_text_model()
    student = make_student(target, "truncated:1")
    ids = rank_tokens([target.tokenizer("abc de fgh hello world")["input_ids"]], target.eos_token_ids)
    folder = save_delta(student, tmp_path / "delta", {"target": "tiny"}, dtype=torch.float32, head_ids=ids)
    assert json.loads((folder / "distilled.json").read_text())["head_vocab"] == len(ids)
    assert torch.equal(load_delta(target, folder).head_ids, ids)
    stop = StopConfig(24, target.eos_token_ids)
    prompt = target.tokenizer("abc de")["input_ids"]
    ar = Engine(target, EngineConfig(method="ar")).generate_ids(prompt, SamplingConfig(), stop)
    engine = Engine(target, EngineConfig(method="sd", drafter=f"distilled:{folder}"))
    proposals = []
    propose = engine.drafter.propose
    engine.drafter.propose = lambda *a, **k: proposals.append(propose(*a, **k)) or proposals[-1]
    sd = engine.generate_ids(prompt, SamplingConfig(), stop)
    assert sd.token_ids == ar.token_ids and sd.stats.num_draft_tokens > 0
    drafted = {int(t) for p in proposals for t in p.tokens}
    assert drafted and drafted <= set(ids.tolist())
    # saving again without head ids removes the restriction
    save_delta(student, folder, {"target": "tiny"}, dtype=torch.float32)
    assert load_delta(target, folder).head_ids is None


def test_agreement_with_a_restricted_head_renormalizes_q_on_the_kept_ids():
    from quickdraft.training.evaluate import agreement
    from quickdraft.training.trainer import scored_logits

    torch.manual_seed(0)
    target, draft = tiny_llama(seed=1).model.eval(), tiny_llama(seed=2).model.eval()
    batch = FixedData(max_response_tokens=6).make([Example([5, 6, 7], [8, 9, 10, 11, 3, 4])], pad_id=0)
    V = target.config.vocab_size
    keep = torch.tensor([0, 3, 4, 8, 9, 10, 11, 20])
    with torch.no_grad():
        p = scored_logits(target, batch).double().softmax(-1)
        q_full = scored_logits(draft, batch).double()
    mask = torch.full((V,), float("-inf"), dtype=torch.float64)
    mask[keep] = 0
    q = (q_full + mask).softmax(-1)
    rows = zip(p.tolist(), q.tolist(), strict=True)
    want = sum(sum(min(a, b) for a, b in zip(pr, qr, strict=True)) for pr, qr in rows) / p.shape[0]
    got = agreement(target, draft, [batch], head_ids=keep)
    full = agreement(target, draft, [batch])
    assert got.expected_acceptance == pytest.approx(want, abs=1e-5)
    assert got.expected_acceptance != pytest.approx(full.expected_acceptance, abs=1e-4)  # the head matters
    assert got.greedy_agreement == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))
