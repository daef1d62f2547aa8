"""The native runtime's linear layer: the packed oneDNN path equals F.linear, and is used only where asked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.kernels import linear
from quickdraft.runtime.kernels.linear import Linear, packed_pays

from conftest import tiny_llama

needs_bf16 = pytest.mark.skipif(not linear._supported(), reason="oneDNN bf16 kernels are not available on this CPU")


@needs_bf16
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_packed_equals_f_linear(rows):
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    packed = Linear(w, pack=True)
    assert packed.packed is not None
    torch.testing.assert_close(packed(x), F.linear(x, w), rtol=1e-2, atol=1e-2)


def test_unpacked_where_not_bf16_or_gradients_are_needed():
    w = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    assert Linear(w, pack=True).packed is None  # float64: always F.linear, read in place
    if linear._supported():
        wb = torch.randn(8, 4, dtype=torch.bfloat16)
        x = torch.randn(2, 4, dtype=torch.bfloat16, requires_grad=True)
        Linear(wb, pack=True)(x).sum().backward()  # the packed kernel has no backward: F.linear is used
        assert x.grad is not None


def test_the_switch_forces_the_choice(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "0")
    assert packed_pays() is False
    target = tiny_llama(vocab=64, layers=1, dtype=torch.bfloat16)
    assert NativeCachedModel(target.model, 64).net.packed is False
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "1")  # the first kernel this host has (oneDNN, else fused)
    assert packed_pays() is any(linear._available(kind) for kind in linear.KINDS)


@needs_bf16
def test_packed_native_forward_equals_unpacked(monkeypatch):
    target = tiny_llama(vocab=64, layers=2, hidden=64, dtype=torch.bfloat16)
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "0")
    plain = NativeCachedModel(target.model, 64)
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "1")
    packed = NativeCachedModel(target.model, 64)
    assert packed.net.packed and not plain.net.packed
    with torch.inference_mode():
        for tokens in ([1, 2, 3, 4, 5, 6], [7], [8, 9, 10]):
            torch.testing.assert_close(packed.extend(tokens), plain.extend(tokens), rtol=2e-2, atol=2e-2)


@needs_bf16
def test_a_draft_head_packed_for_drafting_equals_the_live_one(monkeypatch):
    """`for_inference` packs a feature head's block and fusion (and HeadLM its restricted LM head):
    the same outputs as the live modules; with gradients on, the live weights are used."""
    from quickdraft.drafters.from_target.reuse import HeadLM
    from quickdraft.models.draft_heads import DraftHeadConfig, FeatureHead, block_cache, for_inference

    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "1")
    target = tiny_llama(vocab=64, layers=2, hidden=64, dtype=torch.bfloat16)
    torch.manual_seed(0)
    live = FeatureHead(DraftHeadConfig.from_target(target.model, "head")).to(torch.bfloat16)
    for p in live.parameters():
        torch.nn.init.normal_(p, std=0.1)
    import copy

    frozen = for_inference(copy.deepcopy(live))
    assert isinstance(frozen.block.frozen.qkv[0], linear.PackedRows) and frozen.frozen_fuse.packed is not None
    feats, embeds = torch.randn(1, 5, 64, dtype=torch.bfloat16), torch.randn(1, 5, 64, dtype=torch.bfloat16)
    positions = torch.arange(5)
    with torch.inference_mode():
        a = live(feats, embeds, positions, block_cache(live.cfg, torch.bfloat16, "cpu"))
        b = frozen(feats, embeds, positions, block_cache(live.cfg, torch.bfloat16, "cpu"))
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        frozen.fuse.weight.zero_()  # the packed copy does not follow: drafting still uses it ...
    with torch.inference_mode():
        torch.testing.assert_close(frozen(feats, embeds, positions), b, rtol=2e-2, atol=2e-2)
    with torch.enable_grad():  # ... while a forward with gradients reads the live weights
        assert frozen(feats, embeds, positions).abs().max() < b.abs().max()
    head = target.model.lm_head.weight.detach()
    ids = torch.tensor([3, 5, 7, 11])
    lm = HeadLM(target.model.model.embed_tokens.weight, head, 64, ids)
    assert (
        lm.linear.packed is not None
        and HeadLM(target.model.model.embed_tokens.weight, head, 64, None).linear.packed is None
    )
    states = torch.randn(2, 64, dtype=torch.bfloat16)
    logits = lm.logits(states)
    torch.testing.assert_close(logits[:, ids], F.linear(states, head[ids]), rtol=2e-2, atol=2e-2)
    assert torch.isinf(logits[:, 0]).all()


def test_the_exactness_probe_tells_a_width_dependent_kernel():
    """`_exact` passes a kernel whose k-row sums are its one-row sums and fails one whose last bits move
    with the row count (the negative control: oneDNN's bf16 matmul on an AMX host, issue #67)."""
    w = torch.randn(48, 32, dtype=torch.bfloat16)
    x = torch.randn(33, 32, dtype=torch.bfloat16)
    assert linear._exact(lambda r: torch.cat([F.linear(row, w) for row in r.split(1)]), x)

    def by_width(r):  # a kernel that rounds a multi-row call another way
        out = F.linear(r.float(), w.float())
        return (out * (1 + 2**-9) if r.shape[0] > 1 else out).to(torch.bfloat16)

    assert not linear._exact(by_width, x)


def test_the_default_choice_never_takes_an_inexact_kernel(monkeypatch):
    """With F.linear made width-dependent and no packed kernel, the exact default falls back to "rows"
    (F.linear one row at a time); the opt-in `fastest` mode keeps F.linear (the control)."""
    import types

    def by_width(x, w):
        out = F.linear(x.float(), w.float())
        return (out * (1 + 2**-9) if x.shape[0] > 1 else out).to(x.dtype)

    monkeypatch.setattr(linear, "F", types.SimpleNamespace(linear=by_width))
    assert linear._measure((64, 32), [], exact=True) == "rows"
    assert linear._measure((64, 32), [], exact=False) is None


def _call(kind, w: torch.Tensor):
    """The k-row call of `kind` over the weight w: a packed kernel, "rows" or F.linear (None)."""
    if kind in linear.KINDS:
        packed = linear._pack(w, kind)
        return lambda x: linear._packed_call(x, packed, kind, w.shape[0])
    if kind == "rows":
        return lambda x: torch.cat([F.linear(r, w) for r in x.split(1)])
    return lambda x: F.linear(x, w)


# the embedded default's and the 1.5B's shapes: oneDNN's bf16 matmul on an AMD EPYC is exact at the first,
# where `packing` probes, and not at the second (its down projection) nor the 1.5B's
SHAPES = [(1536, 576), (576, 1536), (960, 576), (8960, 1536), (1536, 8960)]


@pytest.mark.parametrize("host_choice", [k for k in linear.KINDS if linear._available(k)])
def test_every_shape_takes_a_kernel_exact_at_that_shape(host_choice, monkeypatch):
    """Whatever this host's choice (`packing`), a linear of each shape takes a kernel whose k-row calls
    give its one-row bits at that shape (`kind_for`), so a verify rounds as the one-row step in every
    layer; where the choice itself is not exact at a shape, another kernel is taken there."""
    monkeypatch.setattr(linear, "packing", lambda shape=None: host_choice)
    x = torch.randn(max(linear.EXACT_PROBE_ROWS), 8960, dtype=torch.bfloat16)
    for shape in SHAPES:
        w = torch.randn(shape, dtype=torch.bfloat16)
        kind = linear.kind_for(shape)
        assert linear._exact(_call(kind, w), x[:, : shape[1]].contiguous()), (host_choice, shape, kind)
        if not linear._exact(_call(host_choice, w), x[:, : shape[1]].contiguous()):
            assert kind != host_choice  # the choice was not exact here: another kernel took it


def test_the_shape_test_fails_the_rule_before_it(monkeypatch):
    """Negative control: with every shape taking the host's choice (the rule before `kind_for`), the
    test above fails on a host where oneDNN is not exact at one of SHAPES (an AMD EPYC: 576x1536)."""
    if not linear._supported():
        pytest.skip("no oneDNN bf16 kernel on this host")
    x = torch.randn(max(linear.EXACT_PROBE_ROWS), 8960, dtype=torch.bfloat16)
    weights = [torch.randn(shape, dtype=torch.bfloat16) for shape in SHAPES]
    if all(linear._exact(_call("onednn", w), x[:, : w.shape[1]].contiguous()) for w in weights):
        pytest.skip("oneDNN is exact at every shape here: nothing for the control to catch")
    monkeypatch.setattr(linear, "kind_for", lambda shape: "onednn")
    with pytest.raises(AssertionError):
        test_every_shape_takes_a_kernel_exact_at_that_shape("onednn", monkeypatch)


def test_the_kernel_a_shape_takes_falls_back_in_order(monkeypatch):
    """kind_for's truth table over a made-up exactness: the host's choice where exact, else the other
    packed kernel, else F.linear (None), else "rows"; a forced kernel or `fastest` is taken as it is."""
    exact = {"onednn": {(4, 4)}, "fused": {(4, 4), (8, 4)}, None: {(4, 4), (8, 4), (16, 4)}}
    monkeypatch.setattr(linear, "packing", lambda shape=None: "onednn")
    monkeypatch.setattr(linear, "_available", lambda kind: True)
    monkeypatch.setattr(linear, "exact_at", lambda shape, kind: shape in exact[kind])
    assert [linear.kind_for(s) for s in [(4, 4), (8, 4), (16, 4), (32, 4)]] == ["onednn", "fused", None, "rows"]
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "fastest")  # the opt-in trade: its kernel everywhere
    assert linear.kind_for((32, 4)) == "onednn"


def test_f_linear_is_probed_per_shape_too(monkeypatch):
    """Issue #80: where `packing` picks F.linear (None), a shape where F.linear is not exact takes an
    exact kernel, not F.linear unprobed (the rule before took it as it was)."""
    monkeypatch.setattr(linear, "packing", lambda shape=None: None)
    monkeypatch.setattr(linear, "_available", lambda kind: kind == "fused")
    monkeypatch.setattr(linear, "exact_at", lambda shape, kind: (kind is None and shape == (4, 4)) or kind == "fused")
    assert [linear.kind_for(s) for s in [(4, 4), (8, 4)]] == [None, "fused"]  # F.linear where exact, else packed
    monkeypatch.setattr(linear, "exact_at", lambda shape, kind: kind is None and shape == (4, 4))
    assert [linear.kind_for(s) for s in [(4, 4), (8, 4)]] == [None, "rows"]


def test_every_verify_width_is_probed():
    """Issue #80: widths were probed at 2, 9, 17 and 33 only; a kernel inexact at 5 rows alone is caught."""
    assert set(range(2, 34)) <= set(linear.EXACT_PROBE_ROWS)
    w = torch.randn(24, 32, dtype=torch.bfloat16)
    x = torch.randn(33, 32, dtype=torch.bfloat16)

    def at_five(r):
        out = F.linear(r.float(), w.float())
        return (out * (1 + 2**-8) if r.shape[0] == 5 else out).to(torch.bfloat16)

    rows = lambda r: torch.cat([F.linear(row.float(), w.float()).to(torch.bfloat16) for row in r.split(1)])  # noqa: E731
    assert linear._exact(rows, x) and not linear._exact(at_five, x)


def test_the_rows_kernel_runs_batched_input_one_row_at_a_time(monkeypatch):
    """Issue #80: the server's batched forward passes (batch, width, in) rows; the rows kernel skipped
    them (3-D), so they took F.linear over many rows exactly where nothing was exact."""
    import types

    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "rows")
    w = torch.randn(40, 32, dtype=torch.bfloat16)
    lin = Linear(w, pack=True)
    seen = []
    monkeypatch.setattr(
        linear, "F", types.SimpleNamespace(linear=lambda x, w: seen.append(x.shape[0]) or F.linear(x, w))
    )
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    y = lin(x)
    assert y.shape == (2, 3, 40) and seen == [1] * 6
    assert torch.equal(y, torch.stack([torch.cat([F.linear(r, w) for r in b.split(1)]) for b in x]))


def test_the_rows_kernel_gives_one_row_bits(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "rows")
    w = torch.randn(40, 32, dtype=torch.bfloat16)
    lin = Linear(w, pack=True)
    assert lin.kind == "rows" and lin.packed is None
    x = torch.randn(9, 32, dtype=torch.bfloat16)
    assert torch.equal(lin(x), torch.cat([F.linear(x[i : i + 1], w) for i in range(9)]))


FORCED = ["0", "rows", "fused", *(["onednn"] if linear._supported() else [])]


@pytest.mark.parametrize("forced", FORCED)
def test_greedy_speculation_equals_plain_decoding_in_bf16_whatever_the_kernel(forced, monkeypatch):
    """Issue #67 item 5: in bf16, with each linear kernel forced, `sd` gives plain decoding's tokens
    where the kernel is exact (the default takes only those), and speculation happened."""
    from quickdraft.engine import Engine
    from quickdraft.settings.options import EngineConfig, options_from

    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", forced)
    if forced in linear.KINDS and not linear._available(forced):
        pytest.skip(f"no {forced} kernel on this host")
    target = tiny_llama(vocab=96, layers=2, hidden=64, seed=3, dtype=torch.bfloat16)
    probe = torch.randn(33, 64, dtype=torch.bfloat16)
    lin = Linear(target.model.lm_head.weight.detach(), pack=True)
    exact = linear._exact(lin, probe)
    ar = Engine(target, EngineConfig(method="ar"))
    sd = Engine(target, options_from({"drafter": "ngram:2:1", "draft_length": 6, "guard": False}))
    for prompt in ([5, 6, 7, 5, 6, 7, 5], [9, 8, 9, 8, 9, 8, 9, 8]):
        a, b = ar.generate(prompt, max_new_tokens=40), sd.generate(prompt, max_new_tokens=40)
        assert b.stats.num_draft_tokens > 0
        if exact:
            assert b.token_ids == a.token_ids
    if forced == "rows":
        assert exact  # one row at a time: exact by construction
    if not exact:  # nothing to hold it to (the default never takes it): said, not passed silently
        pytest.skip(f"the {forced} kernel is not exact on this host: its verify may round otherwise")
