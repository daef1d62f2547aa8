"""The native runtime's linear layers: `F.linear`, or oneDNN's pre-packed bf16 kernel where it is faster.

Profiled on an Intel Xeon with AVX-512-BF16 (torch 2.13.0+cpu, 2 threads; docs/benchmarks.md,
"Suffix drafting"): `aten::mm` is 75-77% of a target forward at 1, 9 and 17 rows, and aten's bf16
matmul there takes a path that a pre-packed oneDNN weight beats by 1.9x at one row (a 576 x 1536
weight: 71 vs 37 us) and 1.3x at 17 rows. Other hosts (the AMD EPYC of earlier runs) may already get
the fast path from aten. So the choice is measured once per process on this host, not assumed:
`packed_pays()` times both on the model's shapes; `QUICKDRAFT_PACKED_LINEAR=0|1` forces it.

Packed weights are copies made at load time (bf16, inference only): a forward that needs gradients,
or a dtype other than bf16, uses `F.linear` on the live weight.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F

from quickdraft.models.quant import concat_rows  # the quantized kinds know their own layout

_PAYS: dict[tuple, bool] = {}


def _supported() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def _packed_call(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _median_s(fn, repeats: int = 30) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def packed_pays(shape: tuple[int, int] = (1536, 576)) -> bool:
    """Whether the packed bf16 kernel beats `F.linear` by 10% at 1 and 9 rows on a (out, in) weight of
    `shape` on this host and thread count (measured once per process, ~0.1 s)."""
    forced = os.environ.get("QUICKDRAFT_PACKED_LINEAR")
    if forced in ("0", "1"):
        return forced == "1" and _supported()
    key = (shape, torch.get_num_threads())
    if key not in _PAYS:
        pays = False
        if _supported():
            try:
                with torch.inference_mode():
                    w = torch.randn(shape, dtype=torch.bfloat16)
                    packed = _pack(w)
                    pays = True
                    for rows in (1, 9):
                        x = torch.randn(rows, shape[1], dtype=torch.bfloat16)
                        fast = _median_s(lambda x=x: _packed_call(x, packed))
                        pays = pays and fast < 0.9 * _median_s(lambda x=x: F.linear(x, w))
            except (AttributeError, RuntimeError):
                pays = False
        _PAYS[key] = pays
    return _PAYS[key]


def packs(weight: torch.Tensor) -> bool:
    """Whether linears over `weight` take the packed kernel here: a bf16 CPU weight on a host and
    thread count where it measures faster (`packed_pays`; other dtypes never measure)."""
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and packed_pays()


class Linear:
    """y = x W^T for a (out, in) weight, packed for oneDNN when `pack` (bf16 CPU weights only).

    Args:
        weight: the live (out, in) weight (read in place by the unpacked path).
        pack: make a packed copy now (the caller decided with `packed_pays`).
    """

    __slots__ = ("weight", "packed")

    def __init__(self, weight: torch.Tensor, pack: bool = False) -> None:
        self.weight = weight
        usable = pack and weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and _supported()
        self.packed = _pack(weight) if usable else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out)."""
        if self.packed is not None and x.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and x.requires_grad):
            return _packed_call(x, self.packed)
        return F.linear(x, self.weight)


class PackedRows:
    """Packed bf16 linears reading one input, as one oneDNN weight over their concatenated rows; a
    forward that is not bf16 inference calls the parts (no unpacked copy is kept)."""

    __slots__ = ("parts", "packed")

    def __init__(self, parts: list[Linear]) -> None:
        self.parts = parts
        self.packed = _pack(torch.cat([p.weight for p in parts]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, sum of the parts' out)."""
        if x.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and x.requires_grad):
            return _packed_call(x, self.packed)
        return torch.cat([p(x) for p in self.parts], dim=-1)


def fuse_rows(parts: list) -> list:
    """Linears reading the same input, as one kernel call where their kinds allow (q, k, v; gate, up):
    packed bf16 Linears, Int8Linears or Int4Linears (one group size) over the concatenated output rows
    (rows are independent: the result is the parts' outputs side by side). Returns [fused] or the parts."""
    if all(isinstance(p, Linear) and p.packed is not None for p in parts):
        return [PackedRows(list(parts))]
    fused = concat_rows(list(parts))
    return list(parts) if fused is None else [fused]


def apply_rows(parts: list, sizes: list[int], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of `fuse_rows`'s result on x: (n, sizes[i]) each."""
    if len(parts) == 1:
        return list(parts[0](x).split(sizes, dim=-1))
    return [p(x) for p in parts]
