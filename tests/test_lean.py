"""The GPU's lean forms (issue #50, `runtime/forward/block_parts.py`), run here on a CPU: RMSNorm as one fused
kernel and RoPE as two fused multiply-adds for half-precision rows round once where Hugging Face's
forms round twice, so they are checked against a float64 reference (as close as Hugging Face's own
forms are, and never taken for float32/float64 rows, which stay bit for bit Hugging Face's); a batch's
additive masks (made once a forward instead of SDPA's conversion in every layer) are exact, so
speculative and plain decoding stay equal in float64 with them, and the masks were additive."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.runtime import kernels
from quickdraft.runtime.caches import batch_cache
from quickdraft.runtime.forward.block_parts import LEAN, lean, rms_norm, rotate
from quickdraft.runtime.forward.llama_block import rope_tables

from conftest import tiny_llama, tiny_text_model


@pytest.fixture
def lean_cpu(monkeypatch):
    monkeypatch.setitem(LEAN, "cpu", True)
    monkeypatch.setitem(LEAN, "off", False)


def _hf_norm(x, w, eps):
    return w * torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _hf_rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def test_lean_forms_are_as_close_to_float64_as_hugging_faces(lean_cpu):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 576, generator=g), 1 + 0.1 * torch.randn(576, generator=g)
    half, half_w = x.bfloat16(), w.bfloat16()
    assert lean(half) and not lean(x) and not lean(x.double())
    ref = _hf_norm(half.double(), half_w.double(), 1e-5)
    lean_err = (rms_norm(half, half_w, 1e-5).double() - ref).abs().max()
    hf_err = (_hf_norm(half, half_w, 1e-5).double() - ref).abs().max()
    assert lean_err <= 1.5 * hf_err and not torch.equal(rms_norm(half, half_w, 1e-5), _hf_norm(half, half_w, 1e-5))
    q = torch.randn(8, 9, 64, generator=g).bfloat16()
    cos, sin = rope_tables(1.0 / 10000 ** (torch.arange(0, 64, 2) / 64), torch.arange(8), torch.bfloat16)
    cos, sin = cos[:, None], sin[:, None]
    ref = _hf_rotate(q.double(), cos.double(), sin.double())
    lean_err = (rotate(q, cos, sin).double() - ref).abs().max()
    assert lean_err <= 1.5 * (_hf_rotate(q, cos, sin).double() - ref).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_rows_keep_hugging_faces_forms_bit_for_bit(lean_cpu, dtype):
    """The negative control of the test above: lean rows differ from Hugging Face's; these never."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 64, generator=g, dtype=dtype), torch.randn(64, generator=g, dtype=dtype)
    cos, sin = torch.randn(16, 64, generator=g, dtype=dtype), torch.randn(16, 64, generator=g, dtype=dtype)
    assert torch.equal(rms_norm(x, w, 1e-6), _hf_norm(x, w, 1e-6))
    assert torch.equal(rotate(x, cos, sin), _hf_rotate(x, cos, sin))


def test_switched_off_lean_forms_are_hugging_faces(lean_cpu, monkeypatch):
    monkeypatch.setitem(LEAN, "off", True)
    x = torch.randn(4, 64).bfloat16()
    assert not lean(x) and torch.equal(
        rms_norm(x, torch.ones(64).bfloat16(), 1e-6), _hf_norm(x, torch.ones(64).bfloat16(), 1e-6)
    )


@pytest.mark.parametrize("method,drafter", [("ar", None), ("sd", "suffix:none")])
def test_additive_masks_keep_speculation_equal_to_plain_in_float64(lean_cpu, flat_costs, monkeypatch, method, drafter):
    """A lone request on the static forward with a batch's masks additive (a GPU's form) gives plain
    decoding's tokens exactly; the attention saw float masks (a spy), and speculation happened. On
    torch's ops, as on a GPU: the fused CPU kernels read bool masks, so they never get additive ones."""
    monkeypatch.setattr(kernels, "usable", lambda x: False)
    seen = []
    sdpa = batch_cache.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask.dtype)
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(batch_cache, "F", SimpleNamespace(scaled_dot_product_attention=spy))  # the batch's only
    target = tiny_text_model(dtype=torch.float64)
    plain = Engine(target, EngineConfig(method="ar", graphs="off"))
    static = Engine(target, EngineConfig(method=method, drafter=drafter, graphs="on"))
    for prompt in ("abcabcabcab", "hello hello hello"):
        want = plain.generate(prompt, max_new_tokens=24)
        got = static.generate(prompt, max_new_tokens=24)
        assert got.token_ids == want.token_ids
        assert method == "ar" or got.stats.num_accepted_draft_tokens > 0
    assert seen and set(seen) == {torch.float64}


def test_a_bf16_batch_forward_with_lean_forms_stays_near_the_reference(lean_cpu, monkeypatch):
    """The whole static forward in bf16 on torch's ops (the fused CPU kernels off, as on a GPU), lean
    against Hugging Face's forms: the same tokens' logits agree to bf16 rounding."""
    from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock
    from quickdraft.runtime.caches.native_cache import NativeCachedModel
    from quickdraft.runtime.forward.graphs import StaticBatchForward

    monkeypatch.setattr(kernels, "usable", lambda x: False)
    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.bfloat16).model
    outs = {}
    for off in (False, True):
        monkeypatch.setitem(LEAN, "off", off)
        target = BatchedTarget(NativeCachedModel(model), 1)
        target.static = StaticBatchForward(target, 256, graphs=False)
        target.prefill(list(range(3, 30)), first=True)
        target.adopt()
        outs[off] = target.forward([RowBlock([4, 5, 6, 7])])[0].float()
    assert torch.allclose(outs[False], outs[True], atol=0.1, rtol=0.05) and not torch.equal(outs[False], outs[True])
