"""The int8 kernels' activation quantization (`kernels/int8_rows.h`, `quantize_rows`), read back through a
w8a8 linear: per row and block of 32, codes round(x * (127 / amax)) to nearest even in float32, scale amax / 127,
and the sums of each half-block of 16. Every level's build (its vector block path and the scalar tail) gives
exactly these codes, so a verify's rows and a one-row step are quantized alike on every host."""

from __future__ import annotations

import pytest
import torch

from quickdraft.runtime.quant.w8a8 import W8A8Linear


def reference_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) -> ((n, k) codes as float, (n, blocks) amax), computed as the kernel's scalar loop does."""
    n, k = x.shape
    blocks = -(-k // 32)
    xf = torch.nn.functional.pad(x.float(), (0, blocks * 32 - k)).view(n, blocks, 32)
    amax = xf.abs().amax(dim=-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))  # float32, as the kernel's
    codes = torch.round(xf * inv[..., None])  # half to even, as lrint
    return codes.view(n, blocks * 32)[:, :k], amax


def kernel_codes(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """The codes the kernel gave x, read off an identity weight of code 127 and scale 1:
    y[o] = (amax / 127) x 127 x code[o], a code |c| <= 127 recovered exactly even from bf16."""
    k = x.shape[1]
    lin = W8A8Linear(127 * torch.eye(k, dtype=torch.int8), torch.ones(k, -(-k // 32)))
    y = lin(x).float()
    per_input = amax.repeat_interleave(32, dim=1)[:, :k]
    return torch.round(torch.where(per_input > 0, y / per_input, torch.zeros(())))


def kernel_half_sums(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """(n, 2 x blocks) half-block sums of the kernel's codes, read off a w8a8 linear with zero codes and a
    min of 1 on one half-block per output: y[o] = (amax / 127) x sum of that half's codes."""
    k = x.shape[1]
    halves = 2 * (-(-k // 32))
    mins = torch.eye(halves)
    lin = W8A8Linear(torch.zeros(halves, k, dtype=torch.int8), torch.ones(halves, halves // 2), mins)
    y = lin(x).float()
    scale = amax.repeat_interleave(2, dim=1) / 127
    return torch.round(torch.where(scale > 0, y / scale, torch.zeros(())))


def _rows(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(rows * 1000 + k)
    x = torch.randn(rows, k) * torch.logspace(-3, 2, k)  # blocks of very different ranges
    x[0, :32] = 0.0  # a block of zeros: scale 0, codes 0
    x[-1, 32:64] = torch.linspace(-1.0, 1.0, 32)  # exact ties x 127 / amax = n + 0.5 occur
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "k"), [(1, 96), (7, 96), (3, 70), (130, 64)])
def test_codes_are_the_scalar_rule_at_every_level(ops, dtype, rows, k):
    """Whole blocks (the vector path), a tail of 6 (70 inputs: the scalar loop), one row and many."""
    x = _rows(rows, k, dtype)
    want, amax = reference_codes(x)
    got = kernel_codes(x, amax)
    assert torch.equal(got, want)
    assert want.abs().max() == 127 and (want[0, :32] == 0).all()


@pytest.mark.parametrize(("rows", "k"), [(1, 96), (5, 70)])
def test_half_block_sums_are_the_codes_sums(ops, rows, k):
    x = _rows(rows, k, torch.float32)
    want, amax = reference_codes(x)
    padded = torch.nn.functional.pad(want, (0, (-k) % 32))
    sums = padded.view(rows, -1, 16).sum(-1)
    assert torch.equal(kernel_half_sums(x, amax), sums)


def test_the_reference_can_fail(ops):
    """The negative control: division by the scale (amax / 127) instead of the product with 127 / amax
    rounds some inputs differently; the readback tells them apart."""
    x = _rows(64, 96, torch.float32)
    want, amax = reference_codes(x)
    blocks = torch.nn.functional.pad(x.float(), (0, 0)).view(64, 3, 32)
    by_division = torch.round(blocks / (amax / 127)[..., None]).view(64, 96)
    assert not torch.equal(by_division, want)
    assert not torch.equal(kernel_codes(x, amax), by_division)
