"""Packed draft weights (weights/weight_files.py): what comes back, how close, and that the loaders
of shipped drafts read packed files as they read plain ones."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from quickdraft.weights import weight_files


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "w": (torch.randn(96, 128, generator=g) * 0.05).to(torch.bfloat16),
        "norm": torch.randn(128, generator=g).to(torch.bfloat16),  # 1-D: kept as is
        "small": torch.randn(4, 8, generator=g).to(torch.bfloat16),  # under MIN_PACKED: kept
    }


@pytest.mark.parametrize("bits,bound", [(8, 0.5 / 127), (4, 0.5 / 15)])
def test_packed_matrices_come_back_within_half_a_step(tmp_path, bits, bound):
    t = _tensors()
    path = tmp_path / "w.safetensors"
    weight_files.write(path, t, bits)
    got = weight_files.read(path)
    assert set(got) == set(t) and got["w"].dtype == torch.bfloat16
    assert torch.equal(got["norm"], t["norm"]) and torch.equal(got["small"], t["small"])
    w = t["w"].float()
    err = (got["w"].float() - w).abs()
    if bits == 8:  # half a step of each row's scale (plus bfloat16's rounding of the result)
        limit = w.abs().amax(dim=1, keepdim=True) * bound * 1.02 + w.abs() * 2**-8
    else:  # half a step of each group of 32's range
        g = w.reshape(96, 4, 32)
        span = (g.amax(dim=2, keepdim=True) - g.amin(dim=2, keepdim=True)).expand_as(g).reshape(96, 128)
        limit = span * bound * 1.05 + w.abs() * 2**-8 + 1e-4
    assert (err <= limit).all()
    assert err.max() > 0  # it did pack (a negative control for the bound: plain files are exact)
    sizes = {b: None for b in (0, bits)}
    for b in sizes:
        weight_files.write(tmp_path / f"{b}.safetensors", {"w": t["w"]}, b)
        sizes[b] = (tmp_path / f"{b}.safetensors").stat().st_size
    assert sizes[bits] < sizes[0] * (0.55 if bits == 8 else 0.35)


def test_plain_files_read_exactly(tmp_path):
    t = _tensors()
    save_file(t, str(tmp_path / "plain.safetensors"))
    weight_files.write(tmp_path / "none.safetensors", t, 0)
    for name in ("plain", "none"):
        got = weight_files.read(tmp_path / f"{name}.safetensors")
        assert all(torch.equal(got[k], t[k]) for k in t)


def test_bad_bits_are_refused(tmp_path):
    with pytest.raises(ValueError, match="bits"):
        weight_files.write(tmp_path / "x.safetensors", _tensors(), 6)


def test_a_packed_head_loads_as_its_unpacked_twin(tmp_path):
    """load_draft_head reads a packed module file: equal to loading the dequantized tensors."""
    import json

    from quickdraft.drafters.kinds import KINDS
    from quickdraft.models.head_files import HEAD_META, HEAD_WEIGHTS, config_dict, load_draft_head
    from quickdraft.training.train_heads import HeadTrainingConfig, new_module

    from conftest import tiny_llama

    target = tiny_llama(vocab=48, layers=2, seed=3, dtype=torch.float32)
    module = new_module("head", target.model, HeadTrainingConfig())
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / HEAD_META).write_text(json.dumps({"config": config_dict(module.cfg)}))
    weight_files.write(folder / HEAD_WEIGHTS, {k: v.to(torch.bfloat16) for k, v in module.state_dict().items()}, 8)
    loaded, _, _ = load_draft_head(folder, KINDS["head"].module, target.model, torch.float32)
    want = weight_files.read(folder / HEAD_WEIGHTS)
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, want[name].float())
