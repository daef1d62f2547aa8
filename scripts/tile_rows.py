"""One linear's cost by row count on one build of the fused kernels: the tile's per-row cost, without
the memory stream (one 8960x1536 weight, small enough for L3; the best of 25 calls; 1 thread by default).
It separates what a row's arithmetic costs from what the weight's bytes cost (scripts/linear_levels_ab.py
times whole layers from memory).

    python scripts/tile_rows.py ~/.cache/quickdraft/kernels/avx2-<key>/quickdraft_fused_avx2.so q4k [threads]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from linear_levels_ab import load

ROWS = (1, 2, 3, 4, 6, 9)


def main() -> None:
    library, form = sys.argv[1], sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    torch.manual_seed(0)
    ops = load(Path(library))
    n, k = 8960, 1536
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    d = torch.rand(n, k // 256) * 1e-3
    if form == "q4k":
        sc, mn = (torch.randint(0, 64, (n, k // 32), dtype=torch.uint8) for _ in range(2))
        w = ops.pack_q4k(codes, sc, mn, d, d.clone())
        call = lambda x: ops.linear_q4k(x, w, n)  # noqa: E731
    elif form == "w4a8":
        w = ops.pack_q4(codes, torch.rand(n, k // 32) * 1e-2, -torch.rand(n, k // 32) * 1e-2)
        call = lambda x: ops.linear_w4a8(x, w, n)  # noqa: E731
    elif form == "w6a8":
        q6 = torch.randint(0, 64, (n, k), dtype=torch.uint8)
        w = ops.pack_q6(q6, torch.randint(-60, 60, (n, k // 16), dtype=torch.int8), d)
        call = lambda x: ops.linear_w6a8(x, w, n)  # noqa: E731
    else:
        raise SystemExit(f"tile_rows: no form {form!r}; choose q4k, w4a8 or w6a8")
    out = []
    for rows in ROWS:
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        times = []
        for _ in range(25):
            start = time.perf_counter()
            call(x)
            times.append(time.perf_counter() - start)
        ms = min(times) * 1000
        out.append(f"{rows}:{ms:.3f} ms ({n * k * rows / ms / 1e6:.1f} GMAC/s)")
    print(form, "  ".join(out))


if __name__ == "__main__":
    main()
