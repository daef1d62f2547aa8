"""The native runtime's linear layers: `F.linear`, or a pre-packed bf16 kernel where one is faster,
of the kernels whose k-row sums are their one-row sums (exact: the default; `packing`).

Two packed kernels exist: quickdraft's own (`runtime/kernels/fused.cpp`: `pack_bf16`/`linear_packed`,
the weight laid out in 16-output blocks of column pairs for AVX512-BF16's vdpbf16ps, streamed once per
call whatever the rows, no horizontal sums) and oneDNN's (`mkldnn._linear_pointwise`). Which is faster
depends on the host (scripts/step_profile.py, docs/benchmarks.md "The step at the floor": ours won on an
AVX-512-BF16 EPYC at 1 and 17 rows, oneDNN's on an AMX Xeon against aten's bf16 matmul). Hosts differ,
so the choice is measured, not assumed, once per host (kept in the cache folder):
`packing()` times the candidates on a model-sized weight at 1 and 9 rows, and each weight shape then
takes that kernel where it is exact at that shape too, else another exact one (`kind_for`: a kernel's
rounding can change with the shape); `QUICKDRAFT_PACKED_LINEAR=fastest` drops the exactness rule,
`=0|1|fused|onednn|rows` forces a kernel (1: the first packed one).

Packed weights are copies made at load time (bf16, inference only): a forward that needs gradients,
or a dtype other than bf16, uses `F.linear` on the live weight.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from quickdraft.host import cpu_model, kept, median_seconds, safe_name
from quickdraft.runtime import kernels
from quickdraft.runtime.quant.rows import concat_rows  # the quantized kinds know their own layout

_CHOICE: dict[tuple, str | None] = {}
KINDS = ("fused", "onednn")


def _supported() -> bool:
    """oneDNN's bf16 kernels are usable on this CPU."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _available(kind: str) -> bool:
    return _supported() if kind == "onednn" else kernels.fused_ops() is not None


def _pack(weight: torch.Tensor, kind: str = "onednn") -> torch.Tensor:
    if kind == "fused":
        return kernels.fused_ops().pack_bf16(weight.detach().contiguous())
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def _packed_call(x: torch.Tensor, packed: torch.Tensor, kind: str = "onednn", out: int = 0) -> torch.Tensor:
    """x (..., in) through a packed weight of `out` outputs -> (..., out)."""
    if kind == "fused":
        return kernels.on_rows(kernels.fused_ops().linear_packed, x, out, packed)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


EXACT_PROBE_ROWS = tuple(range(2, 34))  # every verify width a tree or chain takes: k rows give k one-row calls' bits


def packing(shape: tuple[int, int] = (1536, 576)) -> str | None:
    """The kernel bf16 linears take on this host and thread count: "fused" (ours), "onednn", "rows"
    (`F.linear` one row at a time) or None (`F.linear`). By default only an exact kernel is taken, one
    whose k-row result has the bits of k one-row calls (probed at `EXACT_PROBE_ROWS`), so a verify and a
    plain step round alike and greedy speculation equals plain decoding in bf16: the fastest exact one
    at 1 and 9 rows, a packed kernel only if it beats `F.linear` by 10% at both; "rows" where nothing
    else is exact. `QUICKDRAFT_PACKED_LINEAR=fastest` takes the fastest whatever its rounding (an opt-in
    trade: speculation then matches plain decoding up to near-ties; the bench reports the rate);
    `=0|1|fused|onednn|rows` forces one. Measured once per host (kept in the cache folder: `_kept`)."""
    forced = os.environ.get("QUICKDRAFT_PACKED_LINEAR")
    if forced in KINDS:
        return forced if _available(forced) else None
    if forced == "rows":
        return "rows"
    if forced == "0":
        return None
    key = (shape, torch.get_num_threads(), forced)
    if key not in _CHOICE:
        candidates = [k for k in KINDS if _available(k)]
        if forced == "1":
            _CHOICE[key] = candidates[0] if candidates else None
        else:
            exact = forced != "fastest"
            _CHOICE[key] = _kept(shape, candidates, lambda: _measure(shape, candidates, exact), exact)
    return _CHOICE[key]


def _exact(call, x: torch.Tensor) -> bool:
    """Whether `call` gives every prefix of x's rows (each width in EXACT_PROBE_ROWS) the bits of one-row calls."""
    rows = torch.cat([call(x[i : i + 1]) for i in range(x.shape[0])])
    return all(torch.equal(call(x[:k]), rows[:k]) for k in EXACT_PROBE_ROWS if k <= x.shape[0])


def _measure(shape: tuple[int, int], candidates: list[str], exact: bool = True) -> str | None:
    """The fastest candidate at 1 and 9 rows if it beats `F.linear` by 10% at both (~0.5 s): each
    timed in turn, 5 times over, keeping each one's best median (a busy host slows every turn); with
    `exact`, only kernels whose k-row sums are the one-row sums (`_exact`), "rows" where none is."""
    try:
        with torch.inference_mode():
            w = torch.randn(shape, dtype=torch.bfloat16)
            xs = [torch.randn(rows, shape[1], dtype=torch.bfloat16) for rows in (1, 9)]
            calls = {None: lambda x: F.linear(x, w)}
            for kind in candidates:
                packed = _pack(w, kind)
                calls[kind] = lambda x, p=packed, k=kind: _packed_call(x, p, k, shape[0])
            if exact:
                probe = torch.randn(max(EXACT_PROBE_ROWS), shape[1], dtype=torch.bfloat16)
                calls = {kind: call for kind, call in calls.items() if _exact(call, probe)}
                if not calls:
                    return "rows"
            best = {kind: [float("inf")] * len(xs) for kind in calls}
            for _ in range(5):
                for kind, call in calls.items():
                    for i, x in enumerate(xs):
                        t = median_seconds(lambda c=call, x=x: c(x), repeats=10, warmup=2)
                        best[kind][i] = min(best[kind][i], t)
    except (AttributeError, RuntimeError):
        return None
    if None not in best:  # F.linear is not exact here: the fastest exact kernel
        return min(best, key=lambda k: sum(best[k]))
    plain = best.pop(None)
    paying = [k for k, t in best.items() if all(a < 0.9 * b for a, b in zip(t, plain, strict=True))]
    return min(paying, key=lambda k: sum(best[k])) if paying else None


def _host_key(shape: tuple[int, int]) -> str:
    """This host, thread count, torch and fused build, and a weight shape: what a kept choice is for."""
    fused = kernels.build_dir().name if kernels.fused_ops() is not None else "none"
    raw = f"{cpu_model()}-{torch.backends.cpu.get_cpu_capability()}-t{torch.get_num_threads()}"
    return raw + f"-torch{torch.__version__}-fused{fused}-{shape[0]}x{shape[1]}"


def _kept(shape: tuple[int, int], candidates: list[str], measure, exact: bool = True) -> str | None:
    """The choice kept for this host (CPU, threads, torch, the fused kernels' build) in the cache
    folder (`host.kept`), `measure()`d and written the first time or when the kept one is no
    longer available. Delete `costs/packing-*.json` there to measure again, or force a kernel with
    QUICKDRAFT_PACKED_LINEAR."""
    from quickdraft.host import cache_dir

    raw = _host_key(shape) + ("-exact33" if exact else "-fastest")  # exact33: every width 2-33 probed

    def decode(stored: dict) -> str | None:
        choice = stored["choice"]
        if choice is not None and choice != "rows" and choice not in candidates:
            raise ValueError(f"packed linear {choice!r} is not available here")
        return choice

    return kept(cache_dir() / "costs" / f"packing-{safe_name(raw)}.json", measure, lambda c: {"choice": c}, decode)


def kind_for(shape: tuple[int, int]) -> str | None:
    """The kernel a bf16 linear over an (out, in) weight takes: `packing()`'s (F.linear's None too), where in the exact
    default it is exact at this shape too (`exact_at`: a kernel's blocking, and with it its rounding,
    changes with the shape; oneDNN's bf16 matmul on an AMD EPYC is exact at 1536x576, where `packing`
    probes, and not at 576x1536, the embedded default's down projection); else the other packed kernel
    where that one is; else `F.linear` where it is; else "rows". A forced kernel and the `fastest`
    opt-in are taken as they are."""
    kind = packing()
    if kind == "rows" or os.environ.get("QUICKDRAFT_PACKED_LINEAR") is not None:
        return kind
    others = [k for k in KINDS if k != kind and _available(k)] + ([None] if kind is not None else [])
    for candidate in (kind, *others):  # packing's pick first, F.linear's None probed per shape too
        if exact_at(tuple(shape), candidate):
            return candidate
    return "rows"


_EXACT_AT: dict[tuple, bool] = {}


def exact_at(shape: tuple[int, int], kind: str | None) -> bool:
    """Whether packed `kind` (None: `F.linear`) gives an (out, in) weight's k-row calls the bits of its
    one-row calls (`_exact` on a random weight of that shape); probed once per shape, host and thread
    count, and kept in the cache folder beside the `packing` choice."""
    key = (shape, kind, torch.get_num_threads())
    if key not in _EXACT_AT:

        def probe() -> bool:
            with torch.inference_mode():
                w = torch.randn(shape, dtype=torch.bfloat16)
                x = torch.randn(max(EXACT_PROBE_ROWS), shape[1], dtype=torch.bfloat16)
                if kind is None:
                    return _exact(lambda r: F.linear(r, w), x)
                packed = _pack(w, kind)
                return _exact(lambda r: _packed_call(r, packed, kind, shape[0]), x)

        from quickdraft.host import cache_dir

        path = cache_dir() / "costs" / f"exact33-{safe_name(_host_key(shape) + '-' + (kind or 'F.linear'))}.json"
        _EXACT_AT[key] = bool(kept(path, probe, lambda ok: {"exact": ok}, lambda stored: bool(stored["exact"])))
    return _EXACT_AT[key]


def packed_pays(shape: tuple[int, int] = (1536, 576)) -> bool:
    """Whether a packed kernel beats `F.linear` here (`packing` is not None)."""
    return packing(shape) is not None


def packs(weight: torch.Tensor) -> bool:
    """Whether linears over `weight` take a packed kernel here: a bf16 CPU weight on a host and
    thread count where one measures faster (`packing`; other dtypes never measure)."""
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and packed_pays()


def _inference(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and x.requires_grad)


class Linear:
    """y = x W^T for a (out, in) weight, packed for this host's packed kernel when `pack` (bf16 CPU
    weights only).

    Args:
        weight: the live (out, in) weight (read in place by the unpacked path).
        pack: make a packed copy now (the caller decided with `packs`).
    """

    __slots__ = ("weight", "packed", "kind")

    def __init__(self, weight: torch.Tensor, pack: bool = False) -> None:
        self.weight = weight
        usable = pack and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
        self.kind = kind_for(tuple(weight.shape)) if usable else None
        self.packed = _pack(weight, self.kind) if self.kind in KINDS else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out)."""
        if self.packed is not None and _inference(x):
            return _packed_call(x, self.packed, self.kind, self.weight.shape[0])
        if self.kind == "rows" and x.dim() >= 2 and x[..., 0].numel() > 1 and _inference(x):  # batched rows too
            flat = x.reshape(-1, x.shape[-1])
            return torch.cat([F.linear(row, self.weight) for row in flat.split(1)]).view(*x.shape[:-1], -1)
        return F.linear(x, self.weight)


class PackedRows:
    """Packed bf16 linears reading one input, as one packed weight over their concatenated rows; a
    forward that is not bf16 inference calls the parts (no unpacked copy is kept)."""

    __slots__ = ("parts", "packed", "kind", "out")

    def __init__(self, parts: list[Linear]) -> None:
        self.parts, self.kind = parts, parts[0].kind
        rows = torch.cat([p.weight for p in parts])
        self.out = rows.shape[0]
        self.packed = _pack(rows, self.kind)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, sum of the parts' out)."""
        if _inference(x):
            return _packed_call(x, self.packed, self.kind, self.out)
        return torch.cat([p(x) for p in self.parts], dim=-1)


def fuse_rows(parts: list) -> list:
    """Linears reading the same input, as one kernel call where their kinds allow (q, k, v; gate, up):
    packed bf16 Linears, Int8Linears or Int4Linears (one group size) over the concatenated output rows,
    and plain Linears on a GPU over a concatenated copy of their weights (rows are independent: the
    result is the parts' outputs side by side). Returns [fused] or the parts."""
    if all(isinstance(p, Linear) and p.packed is not None for p in parts) and len({p.kind for p in parts}) == 1:
        shape = (sum(p.weight.shape[0] for p in parts), parts[0].weight.shape[1])
        if kind_for(shape) == parts[0].kind:  # exact over the concatenated rows too
            return [PackedRows(list(parts))]
        return list(parts)
    if all(type(p) is Linear and p.packed is None and p.weight.device.type == "cuda" for p in parts):
        # a GPU's small-batch GEMMs cost a launch each (issue #50): one over the rows, a copy of them
        return [Linear(torch.cat([p.weight for p in parts]))]
    fused = concat_rows(list(parts))
    return list(parts) if fused is None else [fused]


def apply_rows(parts: list, sizes: list[int], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of `fuse_rows`'s result on x: (n, sizes[i]) each."""
    if len(parts) == 1:
        return list(parts[0](x).split(sizes, dim=-1))
    return [p(x) for p in parts]
