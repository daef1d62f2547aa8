"""Issue #80 item 1: quantization in one room (`runtime/quant/`). Every quantized linear stands on one base
class (with a control that a class off it is found), a new GGUF block type is one record and one registry
line (a toy type registered here loads from a file, and is refused without it), and the packed draft
files' int8 grid is the int8 linear's."""

from __future__ import annotations

import inspect
import pkgutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from transformers import LlamaConfig

import quickdraft.runtime.quant as room
from quickdraft.errors import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.quant import formats
from quickdraft.runtime.quant.formats.base import Format
from quickdraft.runtime.quant.gguf_linears import gguf_linears
from quickdraft.runtime.quant.linear_base import QuantLinear
from quickdraft.runtime.quant.torch_linears import int4_linear, int8_linear
from quickdraft.weights.weight_files import pack_int8


def linear_classes(package) -> dict[str, type]:
    """{name: class} of every class in the package's modules that computes with a weight (`dequantized`)."""
    found = {}
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = __import__(info.name, fromlist=["_"])
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and hasattr(cls, "dequantized"):
                found[f"{module.__name__}.{name}"] = cls
    return found


VIEWS = "quickdraft.runtime.quant.rows."  # RowSlice, KeptRows: views over a linear of some form, not forms


def off_the_base(classes: dict[str, type]) -> set[str]:
    return {name for name, cls in classes.items() if not issubclass(cls, QuantLinear) and not name.startswith(VIEWS)}


def test_every_quantized_linear_stands_on_one_base_class():
    classes = linear_classes(room)
    assert len(classes) >= 6  # aten's int8 and int4, w8a8, w4a8, w6a8, q4k
    assert off_the_base(classes) == set()


def test_a_linear_off_the_base_is_found():  # negative control
    class Stray:
        def dequantized(self): ...

    assert off_the_base({"a_module.Stray": Stray}) == {"a_module.Stray"}


@pytest.mark.parametrize("build", [int8_linear, lambda w: int4_linear(w, 32)], ids=["int8", "int4"])
def test_a_base_linear_counts_the_bytes_it_streams(build):
    lin = build(torch.randn(48, 64))
    assert isinstance(lin, QuantLinear) and lin.out_features == 48 and lin.shape == (48, 64)
    assert lin.nbytes == sum(t.numel() * t.element_size() for t in lin.stored()) > 0
    x = torch.randn(3, 64)
    torch.testing.assert_close(lin(x), x @ lin.dequantized().T, atol=1e-3, rtol=1e-3)


class ToyLinear(QuantLinear):
    """A toy form: the block type's float values, called as a plain matmul (all a form must say)."""

    __slots__ = ("shape", "weight")

    def __init__(self, weight: torch.Tensor) -> None:
        self.shape, self.weight = tuple(weight.shape), weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T.to(x.dtype)

    def stored(self):
        return (self.weight,)

    def dequantized(self) -> torch.Tensor:
        return self.weight


TOY = GGMLQuantizationType.TQ2_0  # a type no record runs: a registered toy record makes it load


def toy_record() -> Format:
    def linear(rows: torch.Tensor) -> ToyLinear:
        return ToyLinear(torch.from_numpy(np.array(dequantize(rows.numpy(), TOY), dtype=np.float32)))

    return Format(TOY.name, 256, 66, linear, "toy: float matmul")


def toy_file(tmp_path):
    weight = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    path = tmp_path / "toy.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    raw = quantize(weight, TOY)
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_shape=raw.shape, raw_dtype=TOY)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, hidden_size=256)
    return path, config, torch.from_numpy(np.array(dequantize(raw, TOY), dtype=np.float32))


def test_a_registered_toy_type_loads_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))  # the registration ends with the test
    path, config, values = toy_file(tmp_path)
    formats.register(toy_record())  # the one line a new type adds
    linears, types = gguf_linears(path, config, q8="w8a8", q4="w4a8")
    lin = linears["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(lin, ToyLinear) and types == {TOY.name: 1}
    assert torch.equal(lin.dequantized(), values)
    with pytest.raises(QuickdraftError, match="already has a record"):
        formats.register(toy_record())


def test_without_its_record_the_toy_type_is_refused(tmp_path):  # negative control
    path, config, _ = toy_file(tmp_path)
    with pytest.raises(QuickdraftError, match=TOY.name):
        gguf_linears(path, config, q8="w8a8", q4="w4a8")


def test_packed_draft_files_round_int8_on_the_int8_linears_grid():
    w = torch.randn(40, 96) * torch.linspace(0.1, 3, 40)[:, None]
    q, scales = pack_int8(w)
    ref = int8_linear(w)
    assert torch.equal(q, ref.q) and torch.equal(scales[:, 0], ref.scales)
    other = torch.round(w / (w.abs().amax(dim=1, keepdim=True) / 126)).clamp(-127, 127).to(torch.int8)
    assert not torch.equal(other, ref.q)  # control: a grid one level narrower is told apart


@pytest.mark.skipif(kernels.fused_ops() is None, reason="needs the fused kernels (a C++ compiler)")
def test_the_fused_forms_share_the_base_call():
    from quickdraft.runtime.quant.w4a8 import w4a8_linear
    from quickdraft.runtime.quant.w8a8 import w8a8_linear

    w, x = torch.randn(32, 64), torch.randn(2, 64)
    for lin in (w8a8_linear(w), w4a8_linear(w)):
        assert type(lin).__call__ is QuantLinear.__call__
        want = x @ lin.dequantized().T  # the activations' int8 rounding aside
        torch.testing.assert_close(lin(x), want, atol=0.03 * want.abs().max().item(), rtol=0)
        assert lin.nbytes == sum(t.numel() * t.element_size() for t in lin.stored())
