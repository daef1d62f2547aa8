"""Linears over several parts' output rows (q|k|v, gate|up): one copy that the parts slice.

`fused_slices` builds one linear over the parts' concatenated rows and hands back the parts as
`RowSlice`s of it; `concat_rows` gives that whole back for consecutive slices (no copy), or builds one
from parts of one quantized kind (the runtime's fused q|k|v and gate|up calls: `runtime/kernels/linear.py`).
"""

from __future__ import annotations

import torch

from quickdraft.runtime.quant.q4k import Q4KLinear
from quickdraft.runtime.quant.q4k import concat as concat_q4k
from quickdraft.runtime.quant.torch_linears import Int4Linear, Int8Linear
from quickdraft.runtime.quant.w4a8 import W4A8Linear
from quickdraft.runtime.quant.w4a8 import concat as concat_w4a8
from quickdraft.runtime.quant.w8a8 import W8A8Linear


class RowSlice:
    """Output rows [start, stop) of a linear: a part of one built over several parts' rows (q|k|v,
    gate|up), so the part and the whole share one copy; `concat_rows` gives the whole back."""

    __slots__ = ("whole", "start", "stop")

    def __init__(self, whole, start: int, stop: int) -> None:
        self.whole, self.start, self.stop = whole, start, stop

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.whole(x)[..., self.start : self.stop]

    def part(self):
        """The rows as a linear of their own (a copy: for inspection, not the hot path)."""
        return self.whole.rows(torch.arange(self.start, self.stop))

    def __getattr__(self, name: str):  # the part's own fields (q, scales, codes, ...), read off a copy
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.part(), name)

    def rows(self, ids: torch.Tensor):
        return self.whole.rows(ids + self.start)

    def dequantized(self) -> torch.Tensor:
        return self.whole.dequantized()[self.start : self.stop]

    @property
    def out_features(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:  # its share of the whole's
        return self.whole.nbytes * (self.stop - self.start) // self.whole.out_features


def fused_slices(parts: list) -> list | None:
    """The parts as RowSlices of one linear over their concatenated rows, or None (`concat_rows`)."""
    whole = concat_rows(parts)
    if whole is None:
        return None
    bounds = [0]
    for p in parts:
        bounds.append(bounds[-1] + p.out_features)
    return [RowSlice(whole, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def concat_rows(parts: list):
    """One Int8Linear / W8A8Linear / W4A8Linear / Q4KLinear / Int4Linear over the parts' concatenated output
    rows, or None when the parts are not all of one quantized kind (and, for int4, one group size). Parts that
    are consecutive RowSlices covering one linear give that linear, not a copy."""
    if all(isinstance(p, RowSlice) for p in parts) and len({id(p.whole) for p in parts}) == 1:
        whole = parts[0].whole
        bounds = [(p.start, p.stop) for p in parts]
        if (
            bounds[0][0] == 0
            and bounds[-1][1] == whole.out_features
            and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        ):
            return whole
    if all(isinstance(p, Int8Linear) for p in parts):
        return Int8Linear(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]))
    if all(isinstance(p, W8A8Linear) for p in parts) and len({p.mins is None for p in parts}) == 1:
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        return W8A8Linear(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]), mins)
    if all(isinstance(p, W4A8Linear) for p in parts):
        return concat_w4a8(parts)
    if all(isinstance(p, Q4KLinear) for p in parts) and len({p.shape[1] for p in parts}) == 1:
        return concat_q4k(parts)
    if all(isinstance(p, Int4Linear) for p in parts) and len({p.group for p in parts}) == 1:
        cat = [torch.cat([getattr(p, name) for p in parts]) for name in ("codes", "scale", "zero")]
        return Int4Linear(*cat, group=parts[0].group)
    return None


class KeptRows:
    """A linear built for some output rows `ids` (K,) of a larger one only: a draft's LM head restricted
    to K token ids, decoded and quantized for those rows alone. `rows` of exactly those ids is the linear
    itself; other ids are looked up among them (an id it lacks is an error, not a wrong row)."""

    __slots__ = ("linear", "ids")

    def __init__(self, linear, ids: torch.Tensor) -> None:
        self.linear, self.ids = linear, ids.to(torch.long)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def rows(self, ids: torch.Tensor):
        ids = ids.to(torch.long)
        if torch.equal(ids, self.ids):
            return self.linear
        where = {token: i for i, token in enumerate(self.ids.tolist())}
        missing = [token for token in ids.tolist() if token not in where]
        if missing:
            raise ValueError(f"KeptRows.rows: rows {missing[:5]} were not built (only {len(where)} kept)")
        return self.linear.rows(torch.tensor([where[token] for token in ids.tolist()]))

    def dequantized(self) -> torch.Tensor:
        return self.linear.dequantized()

    @property
    def out_features(self) -> int:
        return int(self.ids.numel())

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes
