"""The host's linear kernels at every width (issue #69 items 1 and 5): for each weight form, what one
model-sized linear costs at 1 to 33 rows on every kernel that can run it, which one is fastest at each
width, and whether a kernel's k-row result has the bits of k one-row calls (exact: only such a kernel
may serve both the one-row step and a verify, or greedy speculation stops equalling plain decoding).

Forms: bf16 (torch's `F.linear`, our packed tile `fused`, oneDNN's packed matmul `onednn`, which takes
AMX tiles, AVX-512 or AVX2 at run time) and a GGUF's blocks as stored times int8 rows on our tiles
(Q8_0: w8a8, Q4_0: w4a8, Q4_K, Q6_K; no library kernel applies their per-block scales). The weights are
random (the cost of a linear does not depend on its values), in enough copies that a call streams its
weight from memory as a model's step does (`STREAM_BYTES` in all; one copy would sit in the last-level
cache and run several times faster at one row); each (kernel, width) is timed in turn, `rounds` times
over, keeping each one's best median, so a busy moment slows every width alike.
`quickdraft kernels` prints it (with the host and the kernel level) and can plot it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from quickdraft.host import median_seconds

WIDTHS = (1, 2, 3, 5, 9, 13, 17, 25, 33)  # a one-row step, then verify widths (budget + 1)
SHAPE = (8960, 1536)  # the Qwen2.5-Coder 1.5B's gate (or up) projection: (out, in)
STORED = ("Q8_0", "Q4_0", "Q4_K", "Q6_K")  # GGUF block types run as stored on our int8-row tiles
FORMS = ("bf16", *STORED)
STREAM_BYTES = 256 << 20  # each kernel's copies together: past any host's last-level cache
_FP16_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # a block's fp16 scale fields


@dataclass(frozen=True)
class Point:
    """One kernel at one width: ms a call, steps (its ms over its own one-row ms), exact (k-row bits ==
    k one-row calls' bits)."""

    form: str
    kernel: str
    rows: int
    ms: float
    steps: float
    exact: bool


def random_blocks(name: str, shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    """(out, in / block_weights * block_bytes) uint8: random blocks of GGUF type `name` with small fp16 scales."""
    from quickdraft.runtime.quant import formats

    fmt, (out, k) = formats.FORMATS[name], shape
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out * k // fmt.block_weights, fmt.block_bytes), dtype=np.uint8)
    for at in _FP16_AT[name]:
        blocks[:, at : at + 2] = rng.uniform(-0.02, 0.02, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    if name == "Q8_0":  # llama.cpp's codes are -127..127
        blocks[:, 2:][blocks[:, 2:] == 0x80] = 0x81
    return torch.from_numpy(blocks.reshape(out, -1))


def copies_for(form: str, shape: tuple[int, int], stream_bytes: int = STREAM_BYTES) -> int:
    """How many copies of a `form` weight of `shape` make `stream_bytes` (at least 1, at most 64)."""
    from quickdraft.runtime.quant import formats

    if form == "bf16":
        per = shape[0] * shape[1] * 2
    else:
        fmt = formats.FORMATS[form]
        per = shape[0] * shape[1] // fmt.block_weights * fmt.block_bytes
    return max(1, min(64, -(-stream_bytes // per)))


def kernels_of(
    form: str, shape: tuple[int, int] = SHAPE, copies: int = 1
) -> dict[str, list[Callable[[torch.Tensor], torch.Tensor]]]:
    """{kernel: [call(x (rows, in) bf16) -> (rows, out)] over `copies` weights} for every kernel this
    host can run `form` on."""
    from quickdraft.runtime.kernels import linear
    from quickdraft.runtime.quant import formats

    if form in STORED:
        return {"ours": [formats.FORMATS[form].linear(random_blocks(form, shape, seed=i)) for i in range(copies)]}
    weights = [torch.randn(shape, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    calls = {"torch": [lambda x, w=w: F.linear(x, w) for w in weights]}
    for kind in linear.KINDS:
        if linear._available(kind):
            packed = [linear._pack(w, kind) for w in weights]
            calls[kind] = [lambda x, p=p, k=kind: linear._packed_call(x, p, k, shape[0]) for p in packed]
    return calls


def _cycling(calls: list[Callable]) -> Callable:
    """One call a time through each copy in turn (a model's step reads each weight once)."""
    turn = itertools.cycle(calls)
    return lambda x: next(turn)(x)


def _exact(call: Callable, x: torch.Tensor) -> bool:
    return torch.equal(call(x), torch.cat([call(x[i : i + 1]) for i in range(x.shape[0])]))


def measure(
    forms: Sequence[str] = FORMS,
    widths: Sequence[int] = WIDTHS,
    shape: tuple[int, int] = SHAPE,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[Point]:
    """Every kernel of every form at every width (see the module docstring)."""
    points = []
    with torch.inference_mode():
        for form in forms:
            copies = kernels_of(form, shape, copies_for(form, shape))
            calls = {kernel: _cycling(c) for kernel, c in copies.items()}
            xs = {k: torch.randn(k, shape[1], dtype=torch.bfloat16) for k in widths}
            best = {(kernel, k): float("inf") for kernel in calls for k in widths}
            for kernel, k in best:  # first calls pay one-off set-up (thread pools, oneDNN's primitives)
                for call in copies[kernel]:
                    call(xs[k])
            for r in range(rounds):
                for (kernel, k), t in best.items():
                    call, x = calls[kernel], xs[k]
                    best[kernel, k] = min(t, median_seconds(lambda c=call, x=x: c(x), repeats=7, warmup=2))
                if progress:
                    progress(f"{form}: round {r + 1}/{rounds}")
            for kernel in calls:
                one = best[kernel, widths[0]]
                for k in widths:
                    exact = k == 1 or _exact(copies[kernel][0], xs[k])
                    points.append(Point(form, kernel, k, 1e3 * best[kernel, k], best[kernel, k] / one, exact))
    return points


def choices(points: Sequence[Point]) -> dict[str, dict[int, tuple[str, str]]]:
    """{form: {width: (the fastest kernel, the fastest exact one)}}."""
    out: dict[str, dict[int, tuple[str, str]]] = {}
    for p in points:
        out.setdefault(p.form, {})
    for form, table in out.items():
        for k in sorted({p.rows for p in points if p.form == form}):
            here = [p for p in points if p.form == form and p.rows == k]
            fastest = min(here, key=lambda p: p.ms).kernel
            exact = [p for p in here if p.exact]
            table[k] = (fastest, min(exact, key=lambda p: p.ms).kernel if exact else "-")
    return out


def table(points: Sequence[Point]) -> str:
    """A markdown table: a row per (form, kernel), ms at one row, then steps at each width (* where a
    width's result is not the one-row bits), and the choice at each width."""
    widths = sorted({p.rows for p in points})
    head = "| form | kernel | 1 row ms | " + " | ".join(f"{k} rows" for k in widths[1:]) + " |"
    lines = [head, "|" + "---|" * (3 + len(widths) - 1)]
    for form, kernel in dict.fromkeys((p.form, p.kernel) for p in points):
        mine = {p.rows: p for p in points if p.form == form and p.kernel == kernel}
        cells = [f"{mine[k].steps:.2f}{'' if mine[k].exact else '*'}" for k in widths[1:]]
        lines.append(f"| {form} | {kernel} | {mine[widths[0]].ms:.3f} | " + " | ".join(cells) + " |")
    for form, picks in choices(points).items():
        cells = [picks[k][0] if picks[k][0] == picks[k][1] else f"{picks[k][0]} (exact: {picks[k][1]})" for k in widths]
        lines.append(f"| {form} | fastest | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(points: Sequence[Point], path: str, title: str) -> None:
    """ms a call against rows, a line per (form, kernel), on log axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for form, kernel in dict.fromkeys((p.form, p.kernel) for p in points):
        mine = [p for p in points if p.form == form and p.kernel == kernel]
        ax.plot([p.rows for p in mine], [p.ms for p in mine], marker="o", label=f"{form} {kernel}")
    ax.set(xscale="log", yscale="log", xlabel="rows", ylabel="ms a call", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def as_json(points: Sequence[Point]) -> list[dict]:
    return [asdict(p) for p in points]
