"""A GGUF target's load holds one copy of its weights (issue #79 item 2, peak memory against the file):
its fused linears are built whole from the file's rows (never built apart, then copied together), each
tensor's pages of the file are dropped once packed, and its bf16 conversion is written in shards, one at
a time (a 7B's bf16 is 15 GB)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from test_formats import random_rows
from transformers import LlamaConfig

from quickdraft.runtime import kernels
from quickdraft.runtime.quant.gguf_linears import gguf_linears
from quickdraft.runtime.quant.quantized import FUSED, fuse_layers
from quickdraft.runtime.quant.rows import RowSlice
from quickdraft.weights.gguf_convert import GGUFFile, has_weights, write_shards

needs_ops = pytest.mark.skipif(kernels.fused_ops() is None, reason="needs the fused CPU kernels")
HIDDEN = 256


def _one_layer(path, types: dict[str, str], rows: dict[str, int]) -> None:
    """A one-layer Llama GGUF holding `types` ({GGUF role: type name}) of rows[role] x HIDDEN."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    for seed, (role, kind) in enumerate(types.items()):
        blocks = random_rows(kind, rows[role], HIDDEN, seed=seed)
        shape = (rows[role], blocks.shape[1])
        writer.add_tensor(f"blk.0.{role}.weight", blocks, raw_shape=shape, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@needs_ops
def test_a_layers_fused_linears_are_built_whole_from_the_files_rows(tmp_path):
    """q|k|v (one type) are one linear over their rows, built once: each part a RowSlice of it, and its
    outputs the same bits as the parts built apart and then copied together (what a load did before);
    gate and up of two types stay apart. Control: with nothing to fuse, no part is a slice."""
    path = tmp_path / "layer.gguf"
    roles = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q6_K"}
    _one_layer(path, roles, {"attn_q": 256, "attn_k": 64, "attn_v": 64, "ffn_gate": 512, "ffn_up": 512})
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, hidden_size=HIDDEN)
    config.model_type = "qwen2"  # rows stored unpermuted: the comparison is of the builds alone
    whole, _ = gguf_linears(path, config, q8="w8a8", q4="w4a8", fuse=FUSED)
    apart, _ = gguf_linears(path, config, q8="w8a8", q4="w4a8")
    attn = [f"model.layers.0.self_attn.{n}_proj.weight" for n in "qkv"]
    assert all(isinstance(whole[n], RowSlice) for n in attn) and len({id(whole[n].whole) for n in attn}) == 1
    assert not any(isinstance(whole[f"model.layers.0.mlp.{n}_proj.weight"], RowSlice) for n in ("gate", "up"))
    assert not any(isinstance(apart[n], RowSlice) for n in attn)  # control
    copied = fuse_layers(dict(apart), config)  # built apart, then concatenated
    x = torch.randn(3, HIDDEN)
    for name in attn:
        assert torch.equal(whole[name](x), copied[name](x))


def _file_pages_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_packed_tensors_pages_of_the_file_are_dropped(tmp_path):
    """`GGUFFile.release` drops a tensor's pages from this process's memory; read again, the values come
    back from the file unchanged. Control: touched and not released, the pages stay."""
    path = tmp_path / "big.gguf"
    rows = 4096  # Q8_0 rows of 256 weights: 272 bytes each, about 1.1 MB a tensor
    _one_layer(path, {"ffn_down": "Q8_0", "ffn_up": "Q8_0"}, {"ffn_down": rows * 8, "ffn_up": rows * 8})
    reader = GGUFFile(path)
    kept, dropped = (t.data for t in reader.tensors)
    before = _file_pages_kib()
    sums = int(kept.sum()), int(dropped.sum())  # every page of both touched
    touched = _file_pages_kib()
    assert touched - before > 0.9 * (kept.nbytes + dropped.nbytes) / 1024
    reader.release(dropped)
    after = _file_pages_kib()
    assert touched - after > 0.9 * dropped.nbytes / 1024  # its pages gone
    assert after - before > 0.9 * kept.nbytes / 1024  # control: the other's stay
    assert (int(kept.sum()), int(dropped.sum())) == sums


def test_a_conversion_is_written_in_shards_that_transformers_reads(tmp_path):
    """Past the limit, the tensors go to shards with transformers' index (each tensor once, the weight map
    naming its file); under it, one model.safetensors as before. Either way `has_weights` sees them."""
    from safetensors.torch import load_file

    items = [(f"t{i}", torch.full((64, 64), float(i), dtype=torch.bfloat16)) for i in range(5)]  # 8 KiB each
    sharded, whole = tmp_path / "sharded", tmp_path / "whole"
    sharded.mkdir()
    whole.mkdir()
    assert write_shards(iter(items), sharded, limit=20_000) == {name for name, _ in items}
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted({f for f in index["weight_map"].values()})
    assert files == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    read = {k: v for f in files for k, v in load_file(sharded / f).items()}
    assert set(read) == set(index["weight_map"]) and all(torch.equal(read[n], t) for n, t in items)
    write_shards(iter(items), whole)
    assert sorted(p.name for p in whole.iterdir()) == ["model.safetensors"]  # control: one file under the limit
    for folder in (sharded, whole):
        assert not has_weights(folder)  # no config yet
        (folder / "config.json").write_text("{}")
        assert has_weights(folder)


def test_a_sharded_conversion_loads_as_the_whole_one(tmp_path):
    """transformers loads the sharded folder to the same weights as the single file."""
    from conftest import tiny_llama

    model = tiny_llama().model
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    for name, limit in (("sharded", 4096), ("whole", 1 << 30)):
        folder = tmp_path / name
        folder.mkdir()
        write_shards(iter(state.items()), folder, limit=limit)
        model.config.save_pretrained(folder)
    from transformers import AutoModelForCausalLM

    a, b = (AutoModelForCausalLM.from_pretrained(tmp_path / n, dtype=torch.bfloat16) for n in ("sharded", "whole"))
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert torch.equal(a.model.embed_tokens.weight, state["model.embed_tokens.weight"])
