"""Trained draft weights stored compactly: int8 rows or 4-bit groups, restored to floats on load.

The package ships trained drafts (the distilled layers, the feature head, SpecDec's block drafter,
Kangaroo's adapter). Stored in bfloat16 they made most of the repository's weight; stored packed:

- int8: each matrix row scaled by its largest magnitude (symmetric, 255 levels), a float32 scale per
  row: half the bytes of bfloat16;
- int4: groups of `group` (32) consecutive inputs of a row, each with its own minimum and step
  (asymmetric, 16 levels), two codes a byte, float16 minimum and step: 5 bits a weight.

Only matrices of at least `MIN_PACKED` elements are packed; norms, biases and small tensors stay as
they are. The file is an ordinary safetensors file whose metadata says how it was packed; `read`
returns a plain {name: tensor} in `dtype` for either kind of file, so loaders do not care. What a
packed draft gives up is measured, not assumed (docs/benchmarks.md: acceptance before and after).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

PACKED = "quickdraft.packed"  # metadata key: "int8" | "int4:G"
MIN_PACKED = 4096


def pack_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) floats -> (N, K) int8 codes and (N, 1) float32 scales (w ~ codes * scales): symmetric per
    row, absmax / 127 (the grid of `runtime/quant/torch_linears.py`'s `int8_linear`, tested equal)."""
    w = w.detach().float()
    scales = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    return torch.round(w / scales).clamp(-127, 127).to(torch.int8), scales


def pack_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) floats (K divisible by `group`, even) -> (N, K/2) uint8 codes, two a byte (low
    nibble first), and (N, K/group) float16 minimum and step per group."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    low = g.amin(dim=2, keepdim=True)
    step = ((g.amax(dim=2, keepdim=True) - low) / 15).clamp_min(1e-6)
    low, step = low.half(), step.half()  # codes are fitted to the stored (rounded) minimum and step
    codes = torch.round((g - low.float()) / step.float()).clamp(0, 15).to(torch.uint8).reshape(n, k)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), low.reshape(n, -1), step.reshape(n, -1)


def unpack_int4(codes: torch.Tensor, low: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: (N, K) float32."""
    n = codes.shape[0]
    both = torch.stack((codes & 15, codes >> 4), dim=2).reshape(n, -1).float()
    groups = low.shape[1]
    both = both.reshape(n, groups, -1)
    return (low.float()[..., None] + both * step.float()[..., None]).reshape(n, -1)


def _packable(t: torch.Tensor, group: int, bits: int) -> bool:
    if t.ndim != 2 or not t.is_floating_point() or t.numel() < MIN_PACKED:
        return False
    return bits == 8 or t.shape[1] % group == 0 and group % 2 == 0


def write(path: Path, tensors: dict[str, torch.Tensor], bits: int = 0, group: int = 32) -> None:
    """Save `tensors` to `path`: as they are (bits 0), or their matrices packed to int8 or int4."""
    if bits not in (0, 4, 8):
        raise ValueError(f"bits must be 0, 4 or 8, got {bits}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not bits or not _packable(t, group, bits):
            out[name] = t.contiguous()
        elif bits == 8:
            out[f"{name}.q8"], out[f"{name}.scale"] = pack_int8(t)
        else:
            out[f"{name}.q4"], out[f"{name}.low"], out[f"{name}.step"] = pack_int4(t, group)
    meta = {PACKED: {0: "none", 8: "int8", 4: f"int4:{group}"}[bits]}
    save_file({k: v.contiguous() for k, v in out.items()}, str(path), metadata=meta)


def read(path: Path, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """{name: tensor} from a file `write` made (packed or not) or any safetensors file; packed
    matrices come back as `dtype`, other tensors as stored."""
    with safe_open(str(path), framework="pt") as f:
        raw = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    out: dict[str, torch.Tensor] = {}
    for key, t in raw.items():
        if key.endswith(".q8"):
            name = key[:-3]
            out[name] = (t.float() * raw[f"{name}.scale"]).to(dtype)
        elif key.endswith(".q4"):
            name = key[:-3]
            out[name] = unpack_int4(t, raw[f"{name}.low"], raw[f"{name}.step"]).to(dtype)
        elif not (key.endswith((".scale", ".low", ".step")) and _has_codes(raw, key)):
            out[key] = t
    return out


def _has_codes(raw: dict[str, torch.Tensor], key: str) -> bool:
    name = key.rsplit(".", 1)[0]
    return f"{name}.q8" in raw or f"{name}.q4" in raw
