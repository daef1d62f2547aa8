"""Instruction-set levels that must give the same bits (issue #78 item 2): AVX-VNNI's 256-bit `vpdpbusd`
replaces AVX2's vpmaddubsw + vpmaddwd in every int8 tile, so every int8 linear at level `avx_vnni` equals
level `avx2` to the bit, at every width 1-33 (every tile height and remainder), float32 and bf16 rows.
A CPU without AVX-VNNI skips with one line; a weight with one code changed is the control that fails.
Arm's levels (dotprod, i8mm) are proven the same way under qemu by scripts/arm_check.sh, run here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_formats import random_rows

from quickdraft.runtime import kernels
from quickdraft.runtime.quant import formats

# one GGUF type per int8 tile: w4a8 (Q4_0), w8a8 (Q8_0), w8a8 with mins (Q2_K), w6a8 (Q6_K), Q4_K's own
TILES = ("Q4_0", "Q8_0", "Q2_K", "Q6_K", "Q4_K")
WIDTHS = list(range(1, 34))
ROOT = Path(__file__).resolve().parents[1]


def level_or_skip(level: str):
    """The level's kernels, or a skip that says in one line why they cannot run here."""
    if level not in kernels.supported_levels():
        pytest.skip(f"this CPU lacks {level} (it runs {', '.join(kernels.supported_levels())})")
    module = kernels.fused_ops(level)
    if module is None:
        pytest.skip(f"the {level} kernels could not be built here")
    return module


def outputs(module, monkeypatch, raw, dtype) -> list[torch.Tensor]:
    """One level's outputs of the linear of GGUF rows `raw` (name, bytes), over rows of every width."""
    monkeypatch.setattr(kernels, "fused_ops", lambda level=None: module)
    name, data = raw
    lin = formats.FORMATS[name].linear(torch.from_numpy(data))
    gen = torch.Generator().manual_seed(7)
    return [lin(torch.randn(m, lin.shape[1], generator=gen).to(dtype)) for m in WIDTHS]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", TILES)
def test_avx_vnni_gives_avx2s_bits_in_every_int8_tile(name, dtype, monkeypatch):
    vnni, avx2 = level_or_skip("avx_vnni"), level_or_skip("avx2")
    raw = (name, random_rows(name, 37, 512, seed=3))  # 37 outputs: a padded last group of 16
    got, want = outputs(vnni, monkeypatch, raw, dtype), outputs(avx2, monkeypatch, raw, dtype)
    assert [m for m, g, w in zip(WIDTHS, got, want, strict=True) if not torch.equal(g, w)] == []
    # control: the same comparison fails for a weight with one block's bytes changed
    changed = raw[1].copy()
    changed[5, 40] ^= 0x11
    other = outputs(avx2, monkeypatch, (name, changed), dtype)
    assert not all(torch.equal(g, w) for g, w in zip(got, other, strict=True))


ARM_TOOLS = shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")


@pytest.mark.slow
@pytest.mark.skipif(not ARM_TOOLS, reason="needs Debian's g++-aarch64-linux-gnu and qemu-user (.ci/run installs them)")
def test_the_arm_levels_are_the_scalar_bits_under_qemu():
    """scripts/arm_check.sh: the int8 tiles and the rows' quantization at dotprod and i8mm equal scalar's
    bits at every width 1-33 under qemu-aarch64, and its control (one wrong lane) is caught."""
    run = subprocess.run(
        ["bash", "scripts/arm_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    passed, failed = (int(w) for w in lines[-1].replace(",", "").split()[::2])
    assert failed == 0 and passed == 2 * (1 + 5 * 33) + 5  # two levels x (quantize + 5 tiles x 33 widths) + controls
    assert any(line.startswith("i8mm ") for line in lines) and any(line.startswith("dotprod ") for line in lines)
    assert all("33/33 widths differ" in line for line in lines if line.startswith("control "))
