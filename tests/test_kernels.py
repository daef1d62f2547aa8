"""The fused CPU kernels (runtime/kernels/fused.cpp) against the torch ops they replace, each kernel alone
and the native forward through them (float64: equal to the torch path to 1e-10)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from quickdraft import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.caches.static_cache import KVCache
from quickdraft.runtime.forward.llama_block import rms_norm, rope_tables, rotate
from quickdraft.runtime.kernels import attention, linear

from conftest import int8_rows, tiny_llama

DEFAULT = kernels.fused_ops()
needs_ops = pytest.mark.skipif(DEFAULT is None, reason="the fused kernels could not be built here")


def test_the_kernels_build_where_a_compiler_exists():
    if shutil.which("c++") or shutil.which("g++"):
        assert DEFAULT is not None, "a C++ compiler is present but the fused kernels did not build"


def test_the_level_is_read_at_run_time_and_forced_by_name(monkeypatch):
    """The level is the best one the running CPU reports (not the build host's); a switch forces one,
    refused by name when unknown or beyond this CPU (CLI: one line, exit 2)."""
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
    v4 = v3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    if "avx2" in kernels.LEVELS:  # x86-64
        assert kernels.supported_levels(v4 | {"avx512_vnni", "avx512_bf16", "amx_tile"})[0] == "avx512_bf16"
        assert kernels.supported_levels(v4 | {"avx512_vnni"})[0] == "avx512_vnni"
        assert kernels.supported_levels(v3) == ["avx2", "scalar"] and kernels.supported_levels(set()) == ["scalar"]
        assert kernels.supported_levels(v3 | {"avx_vnni"}) == ["avx_vnni", "avx2", "scalar"]  # Alder Lake and later
        assert kernels.supported_levels(v4 | {"avx_vnni"})[:2] == ["avx512", "avx_vnni"]  # AVX-512 first
    from quickdraft.runtime.kernels import levels

    monkeypatch.setattr(levels, "cpu_features", lambda: frozenset(v3))
    monkeypatch.delenv("QUICKDRAFT_KERNEL_LEVEL", raising=False)
    assert kernels.chosen_level() in ("avx2", "scalar", kernels.NATIVE)  # scalar: an Arm host without asimddp
    monkeypatch.setenv("QUICKDRAFT_KERNEL_LEVEL", "scalar")
    assert kernels.chosen_level() in ("scalar", kernels.NATIVE)  # forced below the best (x86-64 and Arm alike)
    monkeypatch.setenv("QUICKDRAFT_KERNEL_LEVEL", "avx9")
    with pytest.raises(QuickdraftError, match="no such level"):
        kernels.chosen_level()
    if kernels.LEVELS is levels.X86:
        monkeypatch.setenv("QUICKDRAFT_KERNEL_LEVEL", "avx512")
        with pytest.raises(QuickdraftError, match="this CPU lacks it"):
            kernels.chosen_level()


def test_a_build_folder_is_keyed_by_level_compiler_and_python_abi(monkeypatch):
    import sysconfig

    base = kernels.build_dir("scalar")
    assert base.name.startswith("scalar-") and kernels.build_dir("avx2") != base
    monkeypatch.setattr(kernels, "_compiler", lambda: "g++ (Other) 99.0")
    assert kernels.build_dir("scalar") != base
    monkeypatch.undo()
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda k: ".cpython-399-x.so" if k == "EXT_SUFFIX" else real(k))
    assert kernels.build_dir("scalar") != base


def test_a_failed_build_names_the_compilers_own_error_line():
    text = (
        "Error building extension 'quickdraft_fused_avx2': [1/2] c++ -MMD -MF fused.o.d -O3 -c fused.cpp\n"
        "FAILED: fused.o\n/src/fused.cpp:12:3: error: 'foo' was not declared in this scope\n"
        "ninja: build stopped: subcommand failed."
    )
    assert kernels.compiler_error(text) == "/src/fused.cpp:12:3: error: 'foo' was not declared in this scope"
    assert kernels.compiler_error("ninja: build stopped.") == "ninja: build stopped."


@needs_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("residual", [False, True])
def test_add_rms_norm_equals_torch(dtype, residual, ops):
    x, h, w = (torch.randn(5, 48, dtype=dtype) for _ in range(2)), None, torch.rand(48, dtype=dtype) + 0.5
    x, h = x
    s, normed = ops.add_rms_norm(x, h if residual else None, w, 1e-5)
    want_s = x + h if residual else x
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    if residual:
        torch.testing.assert_close(s, want_s, **tol)
    torch.testing.assert_close(normed, rms_norm(want_s, w, 1e-5), **tol)


@needs_ops
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("d", [16, 64, 128, 256])  # head sizes: the AVX-512 paths' 16-lane blocks
def test_rope_store_and_attend_equal_rope_and_sdpa(dtype, masked, d, ops):
    heads, kv, at, t = 6, 2, 37, 5
    torch.manual_seed(0)
    cache = KVCache(1, kv, d, dtype, "cpu", capacity=64)
    cache.k[0, :, :at] = torch.randn(kv, at, d, dtype=dtype)
    cache.v[0, :, :at] = torch.randn(kv, at, d, dtype=dtype)
    y = torch.randn(t, (heads + 2 * kv) * d, dtype=dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_tables(inv, torch.arange(at, at + t), dtype)
    # the torch path
    yh = y.view(t, heads + 2 * kv, d)
    qk = rotate(yh[:, : heads + kv], cos[:, None], sin[:, None])
    q_want, k_want, v_want = qk[:, :heads], qk[:, heads:], yh[:, heads + kv :]
    keys = torch.cat([cache.k[0, :, :at], k_want.transpose(0, 1)], dim=1)
    values = torch.cat([cache.v[0, :, :at], v_want.transpose(0, 1)], dim=1)
    mask = torch.rand(t, at + t) > 0.3 if masked else None
    if mask is not None:
        mask[:, at:] = torch.eye(t, dtype=torch.bool) | mask[:, at:].tril()  # each row sees itself
    att = F.scaled_dot_product_attention(
        q_want.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask, enable_gqa=True
    )[0]
    want = att.transpose(0, 1).flatten(1)
    # the kernels
    q = ops.rope_store(y, cos, sin, cache.k[0], cache.v[0], at, heads, kv)
    got = ops.attend(q, cache.k[0], cache.v[0], at + t, mask)
    tols = {torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}
    tol = {"atol": tols[dtype], "rtol": tols[dtype]}
    torch.testing.assert_close(q, q_want, **tol)
    torch.testing.assert_close(cache.k[0, :, at : at + t], k_want.transpose(0, 1), **tol)
    torch.testing.assert_close(cache.v[0, :, at : at + t], v_want.transpose(0, 1), **tol)
    torch.testing.assert_close(got, want, **tol)


@needs_ops
def test_silu_mul_equals_torch(ops):
    gu = torch.randn(4, 2 * 40, dtype=torch.float32) * 4
    torch.testing.assert_close(ops.silu_mul(gu), F.silu(gu[:, :40]) * gu[:, 40:], atol=1e-5, rtol=1e-5)


@needs_ops
def test_gelu_tanh_mul_equals_torch(ops):
    gu = torch.randn(4, 2 * 40, dtype=torch.float32) * 4
    want = F.gelu(gu[:, :40], approximate="tanh") * gu[:, 40:]
    torch.testing.assert_close(ops.gelu_tanh_mul(gu), want, atol=1e-5, rtol=1e-5)


@needs_ops
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("at, t", [(37, 21), (0, 90)])  # a verify after a context; a prefill past ATTEND_ROWS
def test_attend_gives_a_row_the_same_bits_whatever_the_keys_after_it(d, dtype, at, t, ops):
    """T causal rows in one call against each row alone over just its keys: equal bits, for every
    tail of keys (the probabilities go through one vector exp, 16 keys at a time; a row reads keys up
    to its last attended one only)."""
    torch.manual_seed(0)
    heads, kv = 4, 2
    q = (torch.randn(t, heads, d) * 3).to(dtype)
    k = (torch.randn(kv, at + t, d) * 3).to(dtype)
    v = torch.randn(kv, at + t, d).to(dtype)
    mask = torch.ones(t, at + t, dtype=torch.bool).tril(diagonal=at)
    wide = ops.attend(q, k, v, at + t, mask)
    alone = torch.cat([ops.attend(q[i : i + 1].contiguous(), k, v, at + i + 1, None) for i in range(t)])
    assert torch.equal(wide, alone)


@needs_ops
def test_a_long_prefill_attends_through_the_kernel_only_on_its_vector_path(monkeypatch):
    """`long_attention`: AVX-512 levels without AMX, bf16/float32 rows, heads of 64/128/256, contexts up to
    KERNEL_CONTEXT keys; elsewhere flash SDPA (AVX2, AMX, float64, other head sizes, a long context)."""
    short, long = attention.KERNEL_CONTEXT, attention.KERNEL_CONTEXT + 1

    def host(level: str, features: set[str]) -> None:
        attention._vector_attention.cache_clear()
        monkeypatch.setattr(kernels, "chosen_level", lambda: level)
        monkeypatch.setattr(attention, "cpu_features", lambda: frozenset(features))

    host("avx512_bf16", {"avx512f", "avx512_bf16"})
    assert attention.long_attention(torch.bfloat16, 128, short) and attention.long_attention(torch.float32, 64, 700)
    assert not attention.long_attention(torch.bfloat16, 128, long)
    assert not attention.long_attention(torch.float64, 128, 700)
    assert not attention.long_attention(torch.bfloat16, 16, 700)
    host("avx512_bf16", {"avx512f", "avx512_bf16", "amx_bf16"})
    assert not attention.long_attention(torch.bfloat16, 128, 700)
    assert not attention.long_attention(torch.float32, 128, 700)
    host("avx2", {"avx2"})
    assert not attention.long_attention(torch.bfloat16, 128, 700)
    attention._vector_attention.cache_clear()


@needs_ops
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17])
@pytest.mark.parametrize("shape", [(96, 64), (37, 23), (1536, 576)])
def test_packed_bf16_linear_equals_f_linear(rows, shape, ops):
    w = torch.randn(shape, dtype=torch.bfloat16)
    x = torch.randn(rows, shape[1], dtype=torch.bfloat16)
    got = ops.linear_packed(x, ops.pack_bf16(w), shape[0])
    want = F.linear(x.float(), w.float())  # fp32 accumulation, then one rounding: as torch's bf16 GEMM
    torch.testing.assert_close(got.float(), want, atol=0.05 * want.abs().max().item() / 8, rtol=1e-2)


@needs_ops
@pytest.mark.parametrize("shape", [(37, 23), (32, 64)])
def test_pack_bf16_lays_out_16_outputs_by_input_pairs(shape, ops):
    """(ceil(N/16), ceil(K/2), 16, 2), zero-padded: the layout `linear_packed` reads, element for element,
    from a strided weight too."""
    w = torch.randn(shape, dtype=torch.bfloat16)
    n, k = shape
    padded = torch.zeros(-(-n // 16) * 16, -(-k // 2) * 2, dtype=torch.bfloat16)
    padded[:n, :k] = w
    want = padded.view(-1, 16, padded.shape[1] // 2, 2).permute(0, 2, 1, 3)
    assert torch.equal(ops.pack_bf16(w), want) and torch.equal(ops.pack_bf16(w.t().contiguous().t()), want)
    assert not torch.equal(ops.pack_bf16(w), padded.view(want.shape))  # the control: rows not interleaved


@needs_ops
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_native_forward_through_the_kernels_equals_the_torch_path(dtype, monkeypatch):
    target = tiny_llama(dtype=dtype, layers=3)
    fused = NativeCachedModel(target.model)
    rows = [[5, 9, 13, 2, 40, 41], [7], [8, 9, 10, 11, 12, 13, 14]]  # a prefill, a step, a verify (> 4 rows)
    got = [fused.extend(r) for r in rows]
    monkeypatch.setattr(kernels, "usable", lambda x: False)
    plain = NativeCachedModel(target.model)
    want = [plain.extend(r) for r in rows]
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@needs_ops
def test_the_fused_kernel_is_the_packed_linear_where_it_measures_faster(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "fused")
    lin = linear.Linear(torch.randn(64, 32, dtype=torch.bfloat16), pack=True)
    assert lin.kind == "fused" and lin.packed.shape == (4, 16, 16, 2)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    torch.testing.assert_close(lin(x).float(), F.linear(x.float(), lin.weight.float()), atol=0.1, rtol=2e-2)
    assert linear.packing() in (None, *linear.KINDS)


def test_the_packed_linear_choice_is_kept_per_host(tmp_path, monkeypatch):
    """Measured once per host and read back by every later process (the kernels' sums differ in their
    last bits, so two processes taking different kernels could print different text); a kept choice
    that is no longer available, or an unreadable file, is measured again."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    calls: list[int] = []

    def measure(choice):
        return lambda: calls.append(1) or choice

    assert linear._kept((64, 32), ["fused"], measure("fused")) == "fused"
    assert linear._kept((64, 32), ["fused"], measure(None)) == "fused" and len(calls) == 1  # read back
    assert linear._kept((64, 32), ["onednn"], measure("onednn")) == "onednn" and len(calls) == 2  # unavailable
    (kept,) = (tmp_path / "costs").glob("packing-*64x32-exact33.json")
    kept.write_text("not json")
    assert linear._kept((64, 32), ["fused"], measure(None)) is None and len(calls) == 3
    assert linear._kept((64, 32), ["fused"], measure("fused")) is None and len(calls) == 3  # None is a choice too


@needs_ops
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 6, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_linear_is_its_int8_weights_times_int8_rows(rows, dtype, ops):
    from quickdraft.runtime.quant.w8a8 import w8a8_linear

    torch.manual_seed(rows)
    w = torch.randn(37, 70)
    lin = w8a8_linear(w)
    assert (lin.dequantized() - w).abs().max() <= lin.scales.max() / 2 + 1e-6  # the weight grid, 32-blocks
    x = torch.randn(rows, 70).to(dtype)
    want = F.linear(int8_rows(x), lin.dequantized())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(lin(x).float(), want, atol=tol * want.abs().max().item(), rtol=tol)
    assert lin(x).dtype == dtype
    # a row's output does not depend on the other rows (integer sums, per-row scales): batch-invariant
    torch.testing.assert_close(torch.cat([lin(x[i : i + 1]) for i in range(rows)]), lin(x), atol=0, rtol=0)


@needs_ops
@pytest.mark.parametrize("rows", [2, 5, 9])
def test_int8_rows_quantized_in_parallel_are_each_row_alone(rows, ops):
    """Rows wide enough that their activation blocks are quantized on both threads, and tiles of 5 and 6
    rows that read the weights once: each row's output is the same bits as the row alone."""
    from quickdraft.runtime.quant.w4a8 import w4a8_linear
    from quickdraft.runtime.quant.w8a8 import w8a8_linear

    torch.manual_seed(rows)
    w = torch.randn(40, 4100)
    x = torch.randn(rows, 4100, dtype=torch.bfloat16)
    for lin in (w8a8_linear(w), w4a8_linear(w)):
        want = F.linear(int8_rows(x), lin.dequantized())
        torch.testing.assert_close(lin(x).float(), want, atol=2e-2 * want.abs().max().item(), rtol=2e-2)
        torch.testing.assert_close(torch.cat([lin(x[i : i + 1]) for i in range(rows)]), lin(x), atol=0, rtol=0)


@needs_ops
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a8_linear_is_its_4bit_weights_times_int8_rows(rows, dtype, ops):
    from quickdraft.runtime.quant.w4a8 import w4a8_linear

    torch.manual_seed(rows)
    w = torch.randn(37, 70)
    lin = w4a8_linear(w)
    step = lin.d.repeat_interleave(32, dim=1)[:, :70]
    assert ((lin.dequantized() - w).abs() <= step / 2 + 1e-3).all()  # the 4-bit grid of each block
    x = torch.randn(rows, 70).to(dtype)
    want = F.linear(int8_rows(x), lin.dequantized())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(lin(x).float(), want, atol=tol * want.abs().max().item(), rtol=tol)
    assert lin(x).dtype == dtype
    if dtype == torch.float32:  # negative control: without the int8 activations the tolerance fails
        plain = F.linear(x.float(), lin.dequantized())
        assert not torch.allclose(plain, want, atol=tol * want.abs().max().item(), rtol=tol)
    # batch-invariant: a row's output is the same bits alone or among others (tiles of 8 rows and of 1)
    torch.testing.assert_close(lin(x[-1:]), lin(x)[-1:], atol=0, rtol=0)
    ids = torch.tensor([19, 3, 36])
    torch.testing.assert_close(lin.rows(ids)(x), lin(x)[:, ids], atol=0, rtol=0)


@needs_ops
def test_w8a8_and_w4a8_target_speculation_equals_its_plain_decoding():
    target = tiny_llama(dtype=torch.float32, layers=3, hidden=64)
    for quantize in ("w8a8", "w4a8"):
        _speculation_equals_plain(target, quantize)


def _speculation_equals_plain(target, quantize: str) -> None:
    from quickdraft import Engine
    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.settings.options import options_from

    ar = Engine(target, options_from({"method": "ar", "quantize": quantize}))
    sd = Engine(target, options_from({"drafter": "ngram", "draft_length": 3, "quantize": quantize}))
    assert ar.info.weights == quantize
    drafted = 0
    for prompt in ([5, 6, 7, 5, 6, 7], [9, 9, 9, 9], [1, 2, 1, 2, 1, 2]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        assert b.token_ids == a.token_ids
        drafted += b.stats.num_draft_tokens
    assert drafted > 0


@needs_ops
def test_the_fused_bf16_forward_is_batch_invariant(monkeypatch):
    """A row verified among others gives the same bits as the same row decoded alone (the kernels and
    the packed linear sum in a fixed order per row), so greedy speculation equals plain decoding
    exactly in bf16 too. (float32 linears are torch's GEMMs, which are not.)"""
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "fused")
    target = tiny_llama(dtype=torch.bfloat16, layers=3, hidden=64)
    owner = NativeCachedModel(target.model)
    prompt, rows = [5, 9, 13, 2, 40, 41, 7, 3], [11, 12, 13, 14, 15, 16, 17]
    owner.prefill(prompt)
    together = owner.extend(rows)
    owner.rollback(len(prompt))
    alone = torch.cat([owner.extend([t]) for t in rows])
    assert torch.equal(together, alone)
    owner.rollback(len(prompt))  # a tree: two branches, each row seeing only its ancestors
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree = owner.extend([11, 12, 20], positions=[8, 9, 9], tree_mask=mask)
    owner.rollback(len(prompt))
    branch = owner.extend([11, 20])
    assert torch.equal(tree[0], together[0]) and torch.equal(tree[1], together[1]) and torch.equal(tree[2], branch[1])


@needs_ops
def test_greedy_speculation_equals_plain_decoding_exactly_in_bf16(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_PACKED_LINEAR", "fused")
    from quickdraft import Engine
    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.settings.options import options_from

    target = tiny_llama(dtype=torch.bfloat16, layers=3, hidden=64)
    ar = Engine(target, options_from({"method": "ar", "dtype": "bfloat16"}))
    engines = [
        Engine(target, options_from({"drafter": "ngram", "draft_length": 4, "dtype": "bfloat16"})),
        Engine(target, options_from({"drafter": "truncated:1", "draft_tree": 8, "tree_width": 2, "dtype": "bfloat16"})),
    ]
    for sd in engines:
        drafted = 0
        for prompt in ([5, 6, 7, 5, 6, 7], [9, 9, 9, 9, 1], [1, 2, 3, 1, 2, 3, 1]):
            a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(32))
            b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(32))
            assert b.token_ids == a.token_ids
            drafted += b.stats.num_draft_tokens
        assert drafted > 0


def _bad_inputs(ops) -> dict:
    """Calls a caller could make with wrong shapes, dtypes, layouts or positions, by what is wrong."""
    bf = torch.bfloat16
    x = torch.randn(3, 48)
    kc, vc = torch.zeros(2, 16, 16), torch.zeros(2, 16, 16)
    y, cos, sin = torch.randn(3, (6 + 4) * 16), torch.randn(3, 16), torch.randn(3, 16)
    q = torch.randn(3, 6, 16)
    pk = ops.pack_bf16(torch.randn(20, 48, dtype=bf))
    return {
        "norm w short": lambda: ops.add_rms_norm(x, None, torch.ones(10), 1e-5),
        "norm w dtype": lambda: ops.add_rms_norm(x, None, torch.ones(48, dtype=torch.float64), 1e-5),
        "norm h shape": lambda: ops.add_rms_norm(x, torch.randn(2, 48), torch.ones(48), 1e-5),
        "norm x 1d": lambda: ops.add_rms_norm(torch.randn(48), None, torch.ones(48), 1e-5),
        "rope cos rows": lambda: ops.rope_store(y, cos[:1], sin[:1], kc, vc, 0, 6, 2),
        "rope cache d": lambda: ops.rope_store(y, cos, sin, torch.zeros(2, 16, 8), torch.zeros(2, 16, 8), 0, 6, 2),
        "rope cache kv": lambda: ops.rope_store(y, cos, sin, torch.zeros(1, 16, 16), torch.zeros(1, 16, 16), 0, 6, 2),
        "rope at neg": lambda: ops.rope_store(y, cos, sin, kc, vc, -5, 6, 2),
        "rope at far": lambda: ops.rope_store(y, cos, sin, kc, vc, 15, 6, 2),
        "rope dtype": lambda: ops.rope_store(y, cos.double(), sin.double(), kc, vc, 0, 6, 2),
        "rope kv0": lambda: ops.rope_store(y, cos, sin, kc, vc, 0, 10, 0),
        "attend d": lambda: ops.attend(q, torch.zeros(2, 16, 8), torch.zeros(2, 16, 8), 4, None),
        "attend len": lambda: ops.attend(q, kc, vc, 99, None),
        "attend len0": lambda: ops.attend(q, kc, vc, 0, None),
        "attend v shape": lambda: ops.attend(q, kc, torch.zeros(2, 8, 16), 4, None),
        "attend mask": lambda: ops.attend(q, kc, vc, 4, torch.ones(3, 5, dtype=torch.bool)),
        "attend additive mask": lambda: ops.attend(q, kc, vc, 4, torch.zeros(3, 4)),
        "attend dtype": lambda: ops.attend(q, kc.double(), vc.double(), 4, None),
        "attend noncontig": lambda: ops.attend(q, kc.transpose(1, 2), vc, 4, None),
        "silu odd": lambda: ops.silu_mul(torch.randn(3, 7)),
        "packed K": lambda: ops.linear_packed(torch.randn(2, 40, dtype=bf), pk, 20),
        "packed N": lambda: ops.linear_packed(torch.randn(2, 48, dtype=bf), pk, 99),
        "packed layout": lambda: ops.linear_packed(
            torch.randn(2, 48, dtype=bf), torch.zeros(2, 24, 16, 3, dtype=bf), 20
        ),
        "w8 scales": lambda: ops.linear_w8a8(
            torch.randn(2, 64), ops.pack_int8(torch.zeros(20, 64, dtype=torch.int8)), torch.zeros(2, 1), 20
        ),
        "w8 N neg": lambda: ops.linear_w8a8(
            torch.randn(2, 64), ops.pack_int8(torch.zeros(20, 64, dtype=torch.int8)), torch.zeros(2, 2, 16), -1
        ),
        "w4 K": lambda: ops.linear_w4a8(
            torch.randn(2, 100),
            ops.pack_q4(torch.zeros(20, 64, dtype=torch.uint8), torch.ones(20, 2), torch.zeros(20, 2)),
            20,
        ),
        "w4 bytes": lambda: ops.linear_w4a8(torch.randn(2, 64), torch.zeros(2, 2, 10, dtype=torch.uint8), 20),
    }


@needs_ops
def test_a_kernel_refuses_what_it_would_read_out_of_bounds(ops):
    """Every tensor a kernel indexes is checked: a wrong shape, dtype, layout or position is a clear
    RuntimeError naming the kernel (TORCH_CHECK), never a crash or a read past the end (issue #47)."""
    for call in _bad_inputs(ops).values():
        with pytest.raises(RuntimeError, match=r"^(add_rms_norm|rope_store|attend|silu_mul|linear_\w+)"):
            call()


def _longest_stall(work) -> float:
    """The longest the calling thread's Python loop waited between two turns while `work()` ran in
    another thread (seconds): the time that thread held the GIL at a stretch."""
    import threading
    import time

    done = threading.Event()
    thread = threading.Thread(target=lambda: (work(), done.set()))
    last, worst = time.perf_counter(), 0.0
    thread.start()
    while not done.is_set():
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    thread.join()
    return worst


@needs_ops
def test_the_kernels_run_without_the_gil():
    """Issue #80: every kernel is bound with the GIL released (fused.cpp), so a long prefill on the
    server's decode thread leaves its event loop running: during one long kernel call the other thread
    never waits for more than a fraction of it. The control: a C call that holds the GIL for as long
    (sorting a long list) stalls the other thread for about its whole length."""
    import time

    from quickdraft.runtime.quant.w4a8 import w4a8_linear

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel on one core, the counting loop on the other
    try:
        lin = w4a8_linear(torch.randn(2048, 2048))
        x = torch.randn(2048, 2048, dtype=torch.bfloat16)
        begin = time.perf_counter()
        lin(x)
        call = time.perf_counter() - begin  # one call's length, alone
        data = list(range(int(3e6 * max(call, 0.05) / 0.03), 0, -1))  # a sort of about the call's length
        kernel_stall = _longest_stall(lambda: lin(x))
        holding_stall = _longest_stall(lambda: sorted(data))
    finally:
        torch.set_num_threads(threads)
    assert kernel_stall < call / 4 and holding_stall > call / 2, (call, kernel_stall, holding_stall)
