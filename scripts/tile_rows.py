"""One linear's cost by row count on one build of the fused kernels: the tile's per-row cost, without
the memory stream (one 8960x1536 weight, small enough for L3; the best of 25 calls; 1 thread by default).
It separates what a row's arithmetic costs from what the weight's bytes cost (scripts/linear_levels_ab.py
times whole layers from memory).

    python scripts/tile_rows.py <build>/quickdraft_fused_avx2.so FORM [threads]   # FORM: q4k, w6a8, w4a8, w8a8 or bf16
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from linear_levels_ab import kernel_calls, load, weights

ROWS = (1, 2, 3, 4, 6, 9)


def main() -> None:
    library, form = sys.argv[1], sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    torch.manual_seed(0)
    ops = load(Path(library))
    n, k = 8960, 1536
    calls = kernel_calls(ops)
    if form not in calls:
        raise SystemExit(f"tile_rows: no form {form!r}; choose {', '.join(calls)}")
    w = weights(ops, n, k)
    out = []
    for rows in ROWS:
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        times = []
        for _ in range(25):
            start = time.perf_counter()
            calls[form](x, w, n)
            times.append(time.perf_counter() - start)
        ms = min(times) * 1000
        out.append(f"{rows}:{ms:.3f} ms ({n * k * rows / ms / 1e6:.1f} GMAC/s)")
    print(form, "  ".join(out))


if __name__ == "__main__":
    main()
