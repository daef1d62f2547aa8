"""Weight-only int8/int4 linears, the GGUF's own blocks, quantized targets and the quantized self-draft.

- kernels: each linear equals F.linear over its own dequantized weight; weights already on a 4-bit
  grid round-trip exactly; GGUF Q4_0/Q4_1/Q8_0 blocks (made by the `gguf` package) give the package's
  own dequantized values exactly; llama.cpp's q/k row order is undone as transformers undoes it;
- a quantized target is tested against itself in float32 (speculation equals its plain decoding);
- the `quant:` self-draft is lossless against a float64 target: greedy equality in chains, trees and
  PEARL, and the law at T = 1 through a real tiny Llama (with negative controls that must fail);
- bad input: one clear line.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants
from test_real_distribution import Named, law_models, pvalue

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.drafters import make_drafter
from quickdraft.engine import Engine
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.quant.formats.q4_0 import int4_form, q4_blocks, q8_0_blocks
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.quant.quantized import quantize_model
from quickdraft.runtime.quant.torch_linears import int4_linear, int8_linear
from quickdraft.settings.options import EngineConfig, options_from
from quickdraft.weights.gguf_convert import unpermute_rows

from conftest import tiny_llama
from oracles import always_accept

GREEDY = SamplingConfig(temperature=0.0)


@pytest.mark.parametrize(
    "text, mode, group",
    [("none", "none", 32), ("int8", "int8", 32), ("w4a8", "w4a8", 32), ("int4", "int4", 32), ("int4:64", "int4", 64)],
)
def test_parse_quantize(text, mode, group):
    spec = parse_quantize(text)
    assert (spec.mode, spec.group) == (mode, group)
    assert str(spec) == text


@pytest.mark.parametrize("text", ["int3", "int4:16", "int4:128", "int8:32", "int4:x", "gguf:32", "w4a8:32"])
def test_parse_quantize_refuses(text):
    with pytest.raises(QuickdraftError):
        parse_quantize(text)


@pytest.mark.parametrize("make", [int8_linear, int4_linear, lambda w: int4_linear(w, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_equals_its_dequantized_weight(make, dtype):
    torch.manual_seed(0)
    w, x = torch.randn(48, 128), torch.randn(5, 128)
    lin = make(w)
    ref = F.linear(x, lin.dequantized())
    out = lin(x.to(dtype)).float()
    tol = 1e-4 if dtype == torch.float32 else 0.05 * ref.abs().max()
    assert out.shape == (5, 48) and (out - ref).abs().max() <= tol
    assert (lin.dequantized() - w).abs().max() < (w.abs().max() / 4)  # a quantization of w, not noise


def test_int4_grid_round_trips_and_rows_are_exact():
    torch.manual_seed(1)
    q = torch.randint(0, 16, (20, 64))
    q[:, [0, 32]], q[:, [1, 33]] = 0, 15  # every group spans the whole grid
    scale, lo = torch.rand(20, 2) + 0.1, torch.randn(20, 2)
    w = (q.view(20, 2, 32) * scale[..., None] + lo[..., None]).view(20, 64)  # on a 4-bit grid per group
    lin = int4_linear(w)
    assert torch.allclose(lin.dequantized(), w, rtol=0, atol=1e-5)
    ids = torch.tensor([19, 3, 7])  # also: 20 rows are padded to 32 for the packing, cut from the output
    x = torch.randn(2, 64)
    assert torch.equal(lin.rows(ids)(x), lin(x)[:, ids])
    i8 = int8_linear(w)
    assert torch.equal(i8.rows(ids)(x), i8(x)[:, ids])


def test_int4_refuses_groups_that_do_not_divide():
    with pytest.raises(QuickdraftError, match="do not divide"):
        int4_linear(torch.randn(16, 48))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_q4_blocks_are_the_packages_dequantized_values(kind):
    qtype = GGMLQuantizationType[kind]
    w = np.random.default_rng(0).standard_normal((32, 96)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    expected = torch.from_numpy(quants.dequantize(raw, qtype))
    lin = int4_form(*q4_blocks(raw, kind))
    assert torch.equal(lin.dequantized(), expected)
    x = torch.randn(3, 96)
    assert torch.allclose(lin(x), F.linear(x, expected), atol=1e-4)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_q4_blocks_run_as_w4a8_blocks_exactly(kind):
    from quickdraft.runtime import kernels
    from quickdraft.runtime.quant.w4a8 import W4A8Linear

    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels")
    qtype = GGMLQuantizationType[kind]
    w = np.random.default_rng(2).standard_normal((20, 96)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    expected = torch.from_numpy(quants.dequantize(raw, qtype))
    lin = W4A8Linear(*q4_blocks(raw, kind))
    assert torch.equal(lin.dequantized(), expected)  # the GGUF's own blocks: d and m are fp16 there too


def test_gguf_q8_0_blocks_are_the_packages_dequantized_values():
    w = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    raw = quants.quantize(w, GGMLQuantizationType.Q8_0)
    expected = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.Q8_0))
    assert torch.equal(q8_0_blocks(raw), expected)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_rows_undoes_llama_cpp_as_transformers_does(heads):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = heads * 8
    w = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    expected = LlamaTensorProcessor()._reverse_permute_weights(w, heads, heads)
    assert np.array_equal(w[unpermute_rows(rows, heads).numpy()], expected)


def _hidden64(dtype):
    return tiny_llama(vocab=40, layers=2, hidden=64, seed=5, dtype=dtype, init=0.2)


@pytest.mark.parametrize("mode", ["int8", "int4", "int4:64"])
def test_a_quantized_target_equals_itself_under_speculation(mode):
    target = _hidden64(torch.float32)
    config = dict(dtype="float32", quantize=mode)
    plain = Engine(target, EngineConfig(method="ar", **config))
    spec = Engine(target, EngineConfig(method="sd", drafter="ngram:2", **config))
    # a fixed tree budget: "auto" sizes it from this host's measured verify costs, and on a loaded host a
    # tiny target's measurement can decline to draft at all (seen in CI: tree_auto_no_speculation)
    tree = Engine(target, options_from({"method": "sd", "drafter": "suffix:none", "draft_tree": 8, **config}))
    prompt, stop = [3, 4, 5, 6, 3, 4, 5], StopConfig(48)
    ref = plain.generate_ids(prompt, GREEDY, stop)
    assert plain.quantized is not None and len(plain.quantized.linears) == 2 * 7 + 1
    for engine in (spec, tree):
        res = engine.generate_ids(prompt, GREEDY, stop)
        assert res.token_ids == ref.token_ids
        assert res.stats.num_draft_tokens > 0  # speculation happened
    bf = Engine(target, EngineConfig(method="ar", dtype="float32")).generate_ids(prompt, GREEDY, stop)
    assert len(bf.token_ids) == len(ref.token_ids)  # (the quantized target is a different model)


def test_a_quantized_linear_reads_the_same_weights_as_dequantized_float32():
    """The native forward with int8 linears equals the plain forward over the dequantized weights."""
    target = _hidden64(torch.float32)
    q = quantize_model(target, parse_quantize("int8"))
    native = NativeCachedModel(target.model, linears=q.linears)
    deq = _hidden64(torch.float32)
    with torch.no_grad():
        params = dict(deq.model.named_parameters())
        for name, lin in q.linears.items():
            params[name].copy_(lin.dequantized())
    plain = NativeCachedModel(deq.model)
    tokens = [5, 9, 2, 11, 30, 7]
    assert torch.allclose(native.extend(tokens), plain.extend(tokens), atol=1e-4)


@pytest.mark.parametrize("method, tree", [("sd", 0), ("sd", 6), ("pearl", 0)])
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_quant_self_draft_is_lossless_greedy_in_float64(method, tree, mode):
    target = _hidden64(torch.float64)
    plain = Engine(target, EngineConfig(method="ar", dtype="float64"))
    options = {"draft_tree": tree} if method == "sd" else {}
    config = EngineConfig(method=method, drafter=f"quant:{mode}", dtype="float64")
    if options:
        from quickdraft.settings.options import options_from

        config = options_from(options, config)
    engine = Engine(target, config)
    assert engine.drafter.model.net.dtype == torch.float32  # the draft runs in its own form
    for prompt in ([3, 4, 5], [10, 11, 12, 13, 10]):
        ref = plain.generate_ids(prompt, GREEDY, StopConfig(40))
        res = engine.generate_ids(prompt, GREEDY, StopConfig(40))
        assert res.token_ids == ref.token_ids
        assert res.stats.num_accepted_draft_tokens > 0  # the quantized copy agrees often


@pytest.mark.slow
def test_quant_self_draft_keeps_the_target_law_through_a_real_cache():
    target, _ = law_models()
    drafter = make_drafter("quant:int4", target, "float64", "native")
    from quickdraft.verifiers.speculative import SpeculativeSampling

    p, rejected = pvalue(SpeculativeSampling(), (target, None), (NativeCachedModel(target.model), drafter))
    assert rejected > 0 and p > 1e-3


@pytest.mark.slow
def test_quant_self_draft_negative_control_fails():
    """Accepting every draft token samples the draft's law, and the test sees it. (Resampling from p on
    a rejection, the other broken rule, biases by about |p - q|, which a 4-bit copy makes too small
    to see in 1,500 samples: that control runs against a noisy draft in test_real_distribution.)"""
    target, _ = law_models()
    drafter = make_drafter("quant:int4", target, "float64", "native")
    assert pvalue(Named(always_accept), (target, None), (NativeCachedModel(target.model), drafter))[0] < 1e-3


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(quantize="int4:16"), "group size"),
        (dict(quantize="int4", runtime="hf"), "native runtime"),
        (dict(drafter="quant:none"), "target itself"),
    ],
)
def test_bad_quantization_options_are_refused_before_loading(config, message):
    with pytest.raises(QuickdraftError, match=message):
        EngineConfig(**config)


def test_quantized_float64_target_and_gguf_of_a_folder_are_refused():
    target = _hidden64(torch.float64)
    with pytest.raises(QuickdraftError, match="bfloat16 or float32"):
        Engine(target, EngineConfig(method="ar", dtype="float64", quantize="int8"))
    with pytest.raises(QuickdraftError, match="not loaded from a GGUF"):
        quantize_model(_hidden64(torch.float32), parse_quantize("gguf"))
    with pytest.raises(QuickdraftError, match="do not divide"):
        quantize_model(tiny_llama(hidden=48), parse_quantize("int4"))  # 48 inputs: no groups of 32


@pytest.mark.real_model
def test_gguf_weights_reproduce_the_default_models_float32_values():
    """Every Q4_1 linear of the shipped GGUF, packed without a round trip, dequantizes to exactly the
    float32 weights the default folder was converted to (transformers' own GGUF loader)."""
    from quickdraft.weights.loading import load_model

    target = load_model("default", "float32")
    q = quantize_model(target, parse_quantize("gguf"))
    params = dict(target.model.named_parameters())
    assert len(q.linears) == 7 * int(target.model.config.num_hidden_layers) + 1
    assert "Q4_1 x210" in q.source and "Q8_0 x1" in q.source
    head = q.linears.pop("lm_head.weight")  # Q8_0, re-rounded to int8 per channel: close, not exact
    exact = target.model.lm_head.weight.detach()
    assert (head.dequantized() - exact).abs().max() <= exact.abs().amax(1).max() / 254 + 1e-6
    for name, lin in q.linears.items():
        assert torch.equal(lin.dequantized(), params[name].detach()), name


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--quantize", "int4:16"], "group size must be 32 or 64"),
        (["--quantize", "gguf"], "not loaded from a GGUF"),
        (["--quantize", "int8", "--runtime", "hf"], "native runtime"),
        (["--drafter", "quant:int2"], "unknown quantization"),
    ],
)
def test_cli_refuses_bad_quantization_in_one_line(tiny_model_dir, capsys, extra, message):
    from quickdraft.cli import main

    argv = ["generate", "abc", "--target", tiny_model_dir, "--dtype", "float32", "--max-new-tokens", "4", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_generates_with_a_quantized_target_and_says_so(tiny_model_dir, capsys):
    from quickdraft.cli import main

    argv = ["generate", "abc", "--target", tiny_model_dir, "--dtype", "float32", "--max-new-tokens", "8"]
    assert main([*argv, "--quantize", "int8", "--drafter", "quant:int4"]) == 0
    out = capsys.readouterr().out
    assert "int8 weights" in out and "drafter quant:int4" in out


def test_bench_runs_a_quantized_target_beside_the_plain_one(tiny_model_dir, tmp_path):
    import json

    from quickdraft.bench.runner import BenchConfig, _methods_with_ar, run_bench

    assert [s.text for s in _methods_with_ar("sd:quantize=int8,drafter=ngram")] == [
        "ar",
        "ar:quantize=int8",
        "sd:quantize=int8,drafter=ngram",
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [t]}) + "\n" for i, t in
                               enumerate(["abc abc abc", "hello hello"])))  # fmt: skip
    cfg = BenchConfig(
        methods="sd:quantize=int8,drafter=ngram,sd:drafter=quant:int8",
        prompts=str(prompts),
        max_new_tokens=12,
        target=tiny_model_dir,
        dtype="float32",
        out=str(tmp_path / "out"),
    )
    summary = run_bench(cfg, progress=False)["methods"]
    assert summary["sd:quantize=int8,drafter=ngram"]["quantize"] == "int8"
    assert summary["sd:quantize=int8,drafter=ngram"]["speedup_vs_own_ar"] > 0
    assert summary["sd:quantize=int8,drafter=ngram"]["lossless_match_rate"] == 1.0  # against its own plain
    assert summary["sd:drafter=quant:int8"]["lossless_match_rate"] == 1.0
    assert summary["sd:drafter=quant:int8"]["num_accepted_draft_tokens"] > 0
    assert "run a different target" in (tmp_path / "out" / "report.md").read_text()


def test_bench_quantize_flag_sets_the_weights_of_every_method_of_ours(tiny_model_dir, tmp_path):
    import json

    from quickdraft.bench.runner import BenchConfig, run_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "c", "turns": ["abc abc abc"]}) + "\n")
    cfg = BenchConfig(
        methods="ar,sd:drafter=ngram,sd:drafter=ngram,quantize=none",
        prompts=str(prompts),
        max_new_tokens=8,
        target=tiny_model_dir,
        dtype="float32",
        quantize="int8",
        out=str(tmp_path / "out"),
    )
    summary = run_bench(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    weights = {r["method"]: r["quantize"] for r in rows}
    assert weights == {
        "ar": "int8",
        "ar:quantize=none": "none",  # added: the plain decoding the unquantized method is compared with
        "sd:drafter=ngram": "int8",
        "sd:drafter=ngram,quantize=none": "none",
    }
    assert summary["methods"]["sd:drafter=ngram,quantize=none"]["lossless_match_rate"] == 1.0
    assert summary["methods"]["sd:drafter=ngram"]["lossless_match_rate"] == 1.0
    assert "with int8 weights" in (tmp_path / "out" / "report.md").read_text()


def test_quant_self_draft_reviews_in_a_cascade_and_stays_lossless():
    """`quant:` as a CS Drafting level (it reviews the n-gram level's drafts), greedy in float64."""
    target = _hidden64(torch.float64)
    prompt, stop = [3, 4, 5, 3, 4, 5, 3], StopConfig(32)
    ref = Engine(target, EngineConfig(method="ar", dtype="float64")).generate_ids(prompt, GREEDY, stop)
    engine = Engine(target, EngineConfig(method="sd", drafter="csd:quant:int4>ngram:2", dtype="float64"))
    res = engine.generate_ids(prompt, GREEDY, stop)
    assert res.token_ids == ref.token_ids and res.stats.num_draft_tokens > 0


def test_no_quantization_accepts_any_dtype():
    """`none` builds nothing and checks no kernel dtype (the parallel PEARL target calls it always)."""
    q = quantize_model(_hidden64(torch.float64), parse_quantize("none"))
    assert q.linears == {} and not q.spec.active


def test_a_bf16_model_is_quantized_from_its_float32_checkpoint(tiny_model_dir):
    """Loaded in bf16, the weights come from the folder's float32 tensors, not the bf16-rounded copies."""
    from quickdraft.weights.loading import load_model

    bf16, f32 = load_model(tiny_model_dir, "bfloat16"), load_model(tiny_model_dir, "float32")
    q = quantize_model(bf16, parse_quantize("int8"))
    assert "torch.float32 checkpoint" in q.source
    name = "model.layers.1.mlp.up_proj.weight"
    exact = int8_linear(dict(f32.model.named_parameters())[name])
    assert torch.equal(q.linears[name].q, exact.q) and torch.equal(q.linears[name].scales, exact.scales)
    rounded = int8_linear(dict(bf16.model.named_parameters())[name])
    assert not torch.equal(q.linears[name].q, rounded.q)  # the bf16 copy would have given other codes


def test_a_bare_quant_drafter_is_the_w4a8_self_draft():
    from quickdraft.drafters.draft_models.model_drafter import parse_quant

    assert parse_quant(None)[0].mode == "w4a8" and parse_quant("int4")[0].mode == "int4"


@pytest.mark.parametrize("mode", ["w4a8", "int8"])
def test_a_restricted_head_is_built_for_its_rows_alone(tiny_model_dir, mode):
    """A draft's head restricted to K ids is decoded and quantized for those rows only (KeptRows), and the
    cache owner's logits equal those of the whole head's build at the kept ids; negative control: another
    restriction is another build, and asking a KeptRows for rows it lacks is an error."""
    import dataclasses

    from quickdraft.runtime.quant.rows import KeptRows
    from quickdraft.weights.loading import load_model

    whole = load_model(tiny_model_dir, "float32")
    ids = torch.tensor([7, 3, 30, 11, 0])
    kept = dataclasses.replace(whole, head_ids=ids)
    full, part = quantize_model(whole, parse_quantize(mode)), quantize_model(kept, parse_quantize(mode))
    head = part.linears["lm_head.weight"]
    assert isinstance(head, KeptRows) and head.out_features == 5 and head.linear.out_features == 5
    assert head.nbytes < full.linears["lm_head.weight"].nbytes / 2  # 5 of 34 rows (kernels pad to 16)
    vocab = whole.output_vocab_size
    a = NativeCachedModel(whole.model, vocab, ids, full.linears).prefill([1, 2, 3])
    b = NativeCachedModel(whole.model, vocab, ids, part.linears).prefill([1, 2, 3])
    assert torch.equal(a, b) and torch.isinf(b[0, 1])  # the same logits; -inf off the kept ids
    other = quantize_model(dataclasses.replace(whole, head_ids=ids[:3]), parse_quantize(mode))
    assert other is not part and other.linears["lm_head.weight"].out_features == 3
    body = [n for n in part.linears if n != "lm_head.weight"]  # another head over the same layers: shared
    assert body and all(other.linears[n] is part.linears[n] for n in body)
    c = NativeCachedModel(whole.model, vocab, ids[:3], other.linears).prefill([1, 2, 3])
    assert torch.equal(c[:, ids[:3]], a[:, ids[:3]])
    spec2 = "int4" if mode != "int4" else "int8"  # control: another spec shares nothing
    third = quantize_model(dataclasses.replace(whole, head_ids=ids[:3]), parse_quantize(spec2))
    assert not any(third.linears[n] is part.linears[n] for n in body)
    assert head.rows(torch.tensor([30, 7])).out_features == 2
    with pytest.raises(ValueError, match="not built"):
        head.rows(torch.tensor([5]))


@pytest.mark.real_model
def test_a_gguf_borns_own_blocks_are_one_build_whatever_the_head():
    """The embedded default under w4a8 runs its GGUF's own blocks, whose head does not depend on a
    restriction: drafts with different `vocab=` share one build (the head is cut later); from floats
    (int8) each restriction has its own head build (control)."""
    import dataclasses

    from quickdraft.weights.loading import load_model

    target = load_model("default", "bfloat16")
    a, b = (dataclasses.replace(target, head_ids=torch.arange(k)) for k in (100, 200))
    own = quantize_model(a, parse_quantize("w4a8"))
    assert "Q4_1" in own.source and quantize_model(b, parse_quantize("w4a8")) is own
    x, y = quantize_model(a, parse_quantize("int8")), quantize_model(b, parse_quantize("int8"))
    assert x is not y
    assert [q.linears["lm_head.weight"].out_features for q in (x, y)] == [100, 200]
