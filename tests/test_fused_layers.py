"""The one-call run of plain Llama blocks (`runtime/kernels/fused_layers.py`, `llama_layers`) is the same bits
as the layer-by-layer kernels it replaces, for every linear kind it takes, with kept states and trees."""

from __future__ import annotations

import pytest
import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.kernels.fused_layers import LayerKernels, kernel_form
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.quant.quantized import quantize_model

from conftest import tiny_llama, tiny_qwen2

needs_ops = pytest.mark.skipif(kernels.fused_ops() is None, reason="the fused kernels could not be built here")


def _owner(target, quantize: str) -> NativeCachedModel:
    linears = None
    if quantize != "none":
        from quickdraft.weights.loading import LoadedModel

        loaded = LoadedModel(target.model, None, "tiny")
        linears = quantize_model(loaded, parse_quantize(quantize)).linears
    return NativeCachedModel(target.model, linears=linears)


def _run(owner: NativeCachedModel) -> list[torch.Tensor]:
    """A prefill, a step, a verify, a tree (with a kept state), as the decoders call them."""
    out = [owner.extend([5, 9, 13, 2, 40, 41, 7, 3]), owner.extend([11])]
    out.append(owner.extend([12, 13, 14, 15, 16]))
    owner.rollback(9)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree = owner.forward([12, 13, 20], positions=[9, 10, 10], tree_mask=mask, keep_hidden=[1, 3])
    return out + [tree.logits, tree.hidden[1], tree.hidden[3]]


@needs_ops
@pytest.mark.parametrize(
    "family, dtype, quantize",
    [
        ("llama", torch.bfloat16, "none"),
        ("llama", torch.float32, "w8a8"),
        ("llama", torch.float32, "w4a8"),
        ("llama", torch.bfloat16, "w4a8"),
        ("qwen2", torch.bfloat16, "none"),  # q/k/v biases inside the call
        ("qwen2", torch.bfloat16, "w4a8"),
    ],
)
def test_one_call_equals_the_layer_by_layer_kernels(family, dtype, quantize, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "fused")
    target = (tiny_llama if family == "llama" else tiny_qwen2)(dtype=dtype, layers=3, hidden=64)
    fast = _owner(target, quantize)
    assert all(layer is not None for layer in fast.net.kernel_layers.layers)  # every block takes the call
    if family == "qwen2":
        assert all(layer[2].numel() > 0 for layer in fast.net.kernel_layers.layers)  # with its bias
    calls = []
    real = LayerKernels.__call__
    monkeypatch.setattr(LayerKernels, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    got = _run(fast)
    assert calls  # the one-call path ran
    monkeypatch.setattr(LayerKernels, "runs", lambda self, *a: False)
    want = _run(_owner(target, quantize))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@needs_ops
def test_linears_the_call_cannot_take_stay_in_python(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "0")  # F.linear: no kernel form
    target = tiny_llama(dtype=torch.bfloat16, layers=2, hidden=64)
    owner = NativeCachedModel(target.model)
    assert kernel_form(owner.net.layers[0].wo) is None
    assert owner.net.kernel_layers.layers == [None, None]
    assert owner.extend([1, 2, 3]).shape[0] == 3


@needs_ops
def test_q_k_v_of_different_kinds_run_in_the_call_as_three_linears(monkeypatch):
    """A Q4_K_M file's v is Q6_K (w8a8) beside Q4_K q and k (w4a8): the three cannot be one linear, and
    the call runs them side by side, the same bits as the Python path's concatenation."""
    from quickdraft.runtime.quant.w4a8 import w4a8_linear
    from quickdraft.runtime.quant.w8a8 import w8a8_linear

    target = tiny_qwen2(dtype=torch.bfloat16, layers=3, hidden=64)
    params = dict(target.model.named_parameters())
    mixed = {}
    for name, p in params.items():
        if name.endswith("proj.weight"):
            mixed[name] = (w8a8_linear if "v_proj" in name or "down_proj" in name else w4a8_linear)(p.detach().float())
    fast = NativeCachedModel(target.model, linears=mixed)
    assert [layer[1].__len__() for layer in fast.net.kernel_layers.layers] == [6, 6, 6]  # q, k, v, o, gate|up, down
    calls = []
    real = LayerKernels.__call__
    monkeypatch.setattr(LayerKernels, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    got = _run(fast)
    assert calls
    monkeypatch.setattr(LayerKernels, "runs", lambda self, *a: False)
    want = _run(NativeCachedModel(target.model, linears=mixed))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@needs_ops
def test_k_quants_run_in_the_call_as_stored(monkeypatch):
    """A Q4_K_M file's layers as they load under w4a8: Q4_K q, k, o, gate|up (q4k) beside Q6_K v and
    down (w6a8), random blocks on a width of 256; the call runs kinds 4 and 3, the same bits as Python's."""
    from quickdraft.runtime.quant.q4k import Q4KLinear
    from quickdraft.runtime.quant.w6a8 import W6A8Linear

    target = tiny_qwen2(dtype=torch.bfloat16, layers=3, hidden=256)
    gen = torch.Generator().manual_seed(0)

    def ints(shape, high):
        return torch.randint(0, high, shape, generator=gen, dtype=torch.uint8)

    def scales(shape, size):
        return torch.rand(shape, generator=gen) * size

    linears = {}
    for name, p in target.model.named_parameters():
        if not name.endswith("proj.weight"):
            continue
        n, k = p.shape
        if "v_proj" in name or "down_proj" in name:
            sc = torch.randint(-60, 60, (n, k // 16), generator=gen, dtype=torch.int8)
            linears[name] = W6A8Linear(ints((n, k), 64), sc, scales((n, k // 256), 2e-4))
        else:
            linears[name] = Q4KLinear(
                ints((n, k), 16),
                ints((n, k // 32), 64),
                ints((n, k // 32), 64),
                *(scales((n, k // 256), 1e-3) for _ in "ab"),
            )
    fast = NativeCachedModel(target.model, linears=linears)
    kinds = [[form[0] for form in layer[1]] for layer in fast.net.kernel_layers.layers]
    assert kinds == [[4, 4, 3, 4, 4, 3]] * 3  # q, k, v, o, gate|up, down
    calls = []
    real = LayerKernels.__call__
    monkeypatch.setattr(LayerKernels, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    got = _run(fast)
    assert calls
    monkeypatch.setattr(LayerKernels, "runs", lambda self, *a: False)
    want = _run(NativeCachedModel(target.model, linears=linears))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
