"""A GGUF's K-quant blocks run as stored: Q6_K (`runtime/quant/w6a8.py`, `kernels/w6a8.h`) and Q4_K
(`runtime/quant/q4k.py`, `kernels/q4k.h`). The decodes against the `gguf` package's own dequantizer,
each kernel against its weights times int8 rows at every instruction-set level this host runs, batch
invariance, and a Q4_K_M file's loader choosing them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_pair import _q4_k_raw

from quickdraft import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.quant import float_source
from quickdraft.runtime.quant.formats.q4_k import q4_k_parts
from quickdraft.runtime.quant.formats.q6_k import q6_k_blocks, q6_k_values, q6_k_weights

from conftest import int8_rows

needs_ops = pytest.mark.skipif(kernels.fused_ops() is None, reason="the fused kernels could not be built here")


def random_q6_k(rows: int, supers: int, seed: int = 4) -> np.ndarray:
    """Random Q6_K rows (gguf has no Q6_K quantizer): any codes and scales, a finite positive d last."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, supers, 210), dtype=np.uint8)
    d = rng.uniform(0.001, 0.02, rows * supers).astype(np.float16)
    raw[..., 208:210] = np.frombuffer(d.tobytes(), np.uint8).reshape(rows, supers, 2)
    return raw.reshape(rows, supers * 210)


def test_q6_k_blocks_decode_exactly_what_gguf_dequantizes():
    raw = random_q6_k(5, 3)
    codes, sc, d = q6_k_blocks(raw)
    assert codes.shape == (5, 768) and sc.shape == (5, 48) and d.shape == (5, 3)
    assert int(codes.max()) <= 63 and codes.dtype == torch.uint8 and sc.dtype == torch.int8
    assert torch.equal(q6_k_weights(codes, sc, d), q6_k_values(raw))
    # negative control: the high bit pairs matter (one code off by 16 in each row changes the values)
    off = codes.clone()
    off[:, 40] ^= 16
    assert not torch.equal(q6_k_weights(off, sc, d), q6_k_values(raw))


@needs_ops
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 9, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w6a8_linear_is_its_q6_k_weights_times_int8_rows(rows, dtype, ops):
    from quickdraft.runtime.quant.w6a8 import W6A8Linear

    raw = random_q6_k(37, 2, seed=rows)  # 37 outputs: a padded last group of 16
    lin = W6A8Linear(*q6_k_blocks(raw))
    exact = q6_k_values(raw)
    assert torch.equal(lin.dequantized(), exact)  # the stored values, unchanged
    assert [torch.equal(a, b) for a, b in zip(lin.parts(), q6_k_blocks(raw), strict=True)] == [True] * 3
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(dtype)
    want = F.linear(int8_rows(x), exact)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    got = lin(x)
    assert got.dtype == dtype and got.shape == (rows, 37)
    torch.testing.assert_close(got.float(), want, atol=tol * want.abs().max().item(), rtol=tol)
    if dtype == torch.float32:  # negative control: without the int8 activations the tolerance fails
        plain = F.linear(x.float(), exact)
        assert not torch.allclose(plain, want, atol=tol * want.abs().max().item(), rtol=tol)
    # batch-invariant: a row's output is the same bits alone or among others, whatever the tiles
    torch.testing.assert_close(torch.cat([lin(x[i : i + 1]) for i in range(rows)]), got, atol=0, rtol=0)
    ids = torch.tensor([19, 3, 36])
    torch.testing.assert_close(lin.rows(ids)(x), got[:, ids], atol=0, rtol=0)


@needs_ops
def test_w6a8_refuses_what_it_cannot_run(ops):
    from quickdraft.runtime.quant.w6a8 import W6A8Linear

    with pytest.raises(QuickdraftError, match="multiple of 256"):
        W6A8Linear(torch.zeros(4, 100, dtype=torch.uint8), torch.zeros(4, 7, dtype=torch.int8), torch.ones(4, 1))
    lin = W6A8Linear(*q6_k_blocks(random_q6_k(3, 1)))
    with pytest.raises(RuntimeError, match="^linear_w6a8: x does not match"):
        lin(torch.randn(2, 288))
    with pytest.raises(RuntimeError, match="^linear_w6a8: packed"):
        ops.linear_w6a8(torch.randn(2, 256), torch.zeros(1, 16, 448, dtype=torch.uint8)[:, ::2], 3)
    with pytest.raises(RuntimeError, match="^pack_q6"):
        ops.pack_q6(torch.zeros(3, 256, dtype=torch.uint8), torch.zeros(3, 15, dtype=torch.int8), torch.ones(3, 1))


@needs_ops
def test_a_q4_k_m_files_k_quants_load_as_stored_under_w4a8_and_re_rounded_otherwise(monkeypatch):
    """`gguf_linears` with q8 = "w8a8" and q4 = "w4a8" (what `--quantize w4a8` asks) keeps Q6_K and Q4_K
    as stored; "int8" and "int4" re-round them."""
    from quickdraft.runtime.quant import gguf_linears
    from quickdraft.runtime.quant.q4k import Q4KLinear
    from quickdraft.runtime.quant.torch_linears import Int4Linear, Int8Linear
    from quickdraft.runtime.quant.w6a8 import W6A8Linear

    class Tensor:
        def __init__(self, kind: str, data: np.ndarray) -> None:
            self.tensor_type = type("T", (), {"name": kind})()
            self.data, self.name = data, "blk.0.ffn_down.weight"

    raw, raw4 = random_q6_k(16, 1), _q4_k_raw(16, 256)
    tensors = [("down", "ffn_down", Tensor("Q6_K", raw)), ("up", "ffn_up", Tensor("Q4_K", raw4))]
    monkeypatch.setattr(gguf_linears, "linear_tensors", lambda path, config: tensors)
    monkeypatch.setattr(gguf_linears, "permuted_heads", lambda config: {})
    monkeypatch.setattr(
        gguf_linears, "open_gguf", lambda path: type("NoPages", (), {"release": lambda _, data: None})()
    )
    fast, types = gguf_linears.gguf_linears(Path("x.gguf"), None, q8="w8a8", q4="w4a8")
    assert types == {"Q6_K": 1, "Q4_K": 1} and isinstance(fast["down"], W6A8Linear)
    assert torch.equal(fast["down"].dequantized(), q6_k_values(raw))
    assert isinstance(fast["up"], Q4KLinear) and torch.equal(fast["up"].dequantized(), q4_k_values(raw4))
    slow, _ = gguf_linears.gguf_linears(Path("x.gguf"), None, q8="int8", q4="int4")
    assert isinstance(slow["down"], Int8Linear) and isinstance(slow["up"], Int4Linear)


def q4_k_values(raw: np.ndarray) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType.Q4_K), dtype=np.float32))


@needs_ops
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 12, 13, 17, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q4k_linear_is_its_q4_k_weights_times_int8_rows(rows, dtype, ops):
    from quickdraft.runtime.quant.q4k import Q4KLinear

    raw = _q4_k_raw(37, 512, seed=rows)  # 37 outputs: a padded last group of 16
    parts = q4_k_parts(raw)
    assert [p.shape for p in parts] == [(37, 512), (37, 16), (37, 16), (37, 2), (37, 2)]
    lin = Q4KLinear(*parts)
    exact = q4_k_values(raw)
    assert torch.equal(lin.dequantized(), exact)  # as stored: w4a8 rounded d sc and dmin mn to fp16
    assert all(torch.equal(a, b) for a, b in zip(lin.parts(), parts, strict=True))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(dtype)
    want = F.linear(int8_rows(x), exact)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    got = lin(x)
    assert got.dtype == dtype and got.shape == (rows, 37)
    torch.testing.assert_close(got.float(), want, atol=tol * want.abs().max().item(), rtol=tol)
    if dtype == torch.float32:  # negative control: the fp16-rounded scales of w4a8 miss this tolerance
        from quickdraft.runtime.quant.formats.q4_k import q4_k_blocks
        from quickdraft.runtime.quant.w4a8 import W4A8Linear

        rounded = W4A8Linear(*q4_k_blocks(raw))(x)
        assert not torch.allclose(rounded, want, atol=tol * want.abs().max().item(), rtol=tol)
    torch.testing.assert_close(torch.cat([lin(x[i : i + 1]) for i in range(rows)]), got, atol=0, rtol=0)
    ids = torch.tensor([19, 3, 36])
    torch.testing.assert_close(lin.rows(ids)(x), got[:, ids], atol=0, rtol=0)


@needs_ops
def test_q4k_parts_concatenate_and_bad_input_is_refused(ops):
    from quickdraft.runtime.quant.q4k import Q4KLinear
    from quickdraft.runtime.quant.rows import concat_rows

    a, b = Q4KLinear(*q4_k_parts(_q4_k_raw(16, 256, 1))), Q4KLinear(*q4_k_parts(_q4_k_raw(5, 256, 2)))
    both = concat_rows([a, b])
    assert isinstance(both, Q4KLinear) and torch.equal(
        both.dequantized(), torch.cat([a.dequantized(), b.dequantized()])
    )
    with pytest.raises(QuickdraftError, match="multiple of 256"):
        Q4KLinear(*(torch.zeros(4, n, dtype=torch.uint8) for n in (100, 3, 3)), torch.ones(4, 1), torch.ones(4, 1))
    with pytest.raises(RuntimeError, match="^linear_q4k: x does not match"):
        a(torch.randn(2, 288))
    with pytest.raises(RuntimeError, match="^pack_q4k"):
        z = torch.zeros(3, 8, dtype=torch.uint8)
        ops.pack_q4k(
            torch.zeros(3, 256, dtype=torch.uint8), z, z[:, :7].contiguous(), torch.ones(3, 1), torch.ones(3, 1)
        )


@needs_ops
def test_gguf_rows_pack_in_one_pass_to_the_decoded_parts_bytes(ops):
    """`pack_q4k_gguf` / `pack_q6_gguf` of a tensor's rows as stored give the bytes `pack_q4k` / `pack_q6`
    give from the decoded parts (37 outputs: a padded last tile of 16; 3 super-blocks)."""
    from quickdraft.runtime.quant.q4k import Q4KLinear
    from quickdraft.runtime.quant.w6a8 import W6A8Linear

    raw4, raw6 = _q4_k_raw(37, 768, seed=5), random_q6_k(37, 3, seed=6)
    from_parts = ops.pack_q4k(*(t.contiguous() for t in q4_k_parts(raw4)))
    assert torch.equal(ops.pack_q4k_gguf(torch.from_numpy(raw4)), from_parts)
    assert torch.equal(
        ops.pack_q6_gguf(torch.from_numpy(raw6)), ops.pack_q6(*(t.contiguous() for t in q6_k_blocks(raw6)))
    )
    assert torch.equal(Q4KLinear.from_gguf(torch.from_numpy(raw4)).dequantized(), q4_k_values(raw4))
    assert torch.equal(W6A8Linear.from_gguf(torch.from_numpy(raw6)).dequantized(), q6_k_values(raw6))
    # negative control: the top bits of scale byte 0 are block 4's sc (llama.cpp's get_scale_min_k4)
    flipped = raw4.copy()
    flipped[0, 4] ^= 0xC0
    assert not torch.equal(ops.pack_q4k_gguf(torch.from_numpy(flipped)), from_parts)
    with pytest.raises(RuntimeError, match="^pack_q4k_gguf"):
        ops.pack_q4k_gguf(torch.zeros(2, 100, dtype=torch.uint8))
    with pytest.raises(QuickdraftError, match="Q6_K rows"):
        W6A8Linear.from_gguf(torch.zeros(2, 100, dtype=torch.uint8))


@needs_ops
def test_q4k_linears_of_whole_tiles_concatenate_as_packed(ops):
    """Parts of whole 16-output tiles join by their packed tiles: the bytes a pack of the joined parts gives."""
    from quickdraft.runtime.quant.q4k import Q4KLinear
    from quickdraft.runtime.quant.rows import concat_rows

    a, b = (Q4KLinear.from_gguf(torch.from_numpy(_q4_k_raw(n, 512, seed=n))) for n in (32, 16))
    both = concat_rows([a, b])
    parts = [torch.cat(ts) for ts in zip(a.parts(), b.parts(), strict=True)]
    assert both.shape == (48, 512) and torch.equal(both.packed, Q4KLinear(*parts).packed)


@needs_ops
def test_the_float_reader_decodes_every_block_type_as_gguf_does(monkeypatch):
    """`w4a8-all`'s float source: Q4_K and Q6_K through the C++ packers, Q8_0 and Q5_0 in torch, each the
    `gguf` package's dequantized values exactly."""
    from gguf import GGMLQuantizationType, quants

    from quickdraft.runtime.quant import gguf_tensors as gguf_weights

    w = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    raws = {
        "Q4_K": _q4_k_raw(16, 256, seed=7),
        "Q6_K": random_q6_k(16, 1, seed=8),
        "Q5_0": quants.quantize(w, GGMLQuantizationType.Q5_0),
        "Q8_0": quants.quantize(w, GGMLQuantizationType.Q8_0),
    }

    class Tensor:
        def __init__(self, kind: str, data: np.ndarray) -> None:
            self.tensor_type, self.data, self.shape = GGMLQuantizationType[kind], data, (256, 16)
            self.name = f"blk.0.{kind}.weight"

    tensors = [(kind, "ffn_up", Tensor(kind, raw)) for kind, raw in raws.items()]
    monkeypatch.setattr(gguf_weights, "linear_tensors", lambda path, config: tensors)
    monkeypatch.setattr(gguf_weights, "permuted_heads", lambda config: {})
    fast = gguf_weights.gguf_float_reader(Path("x.gguf"), None, float_source.exact_decoders())
    assert set(float_source.exact_decoders()) == {"Q4_K", "Q6_K"}
    for kind, raw in raws.items():
        want = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]))
        assert torch.equal(fast(kind), want), kind
        rows = torch.tensor([9, 0, 15, 3])  # some output rows alone, in any order: decoded from their own blocks
        assert torch.equal(fast(kind, rows), want[rows]), kind
