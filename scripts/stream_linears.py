"""What the 4-bit linears of a whole 1.5B step cost over k rows when their weights stream from memory.

28 layers of Qwen2.5-1.5B's shapes (gate|up 17920x1536, down 1536x8960, q|k|v 2048x1536, o 1536x1536),
random 4-bit codes in `pack_q4`'s layout (819 MB: far beyond the caches, as in a real step), run one
after the other at 1-16 rows; the best of 5 passes per row count, as a multiple of one row. Issue #49's
verify curve: docs/benchmarks.md ("The verify's weights fetched ahead").

    python scripts/stream_linears.py [--threads 2]
"""

import argparse
import time

import torch

from quickdraft.runtime.quant.w4a8 import W4A8Linear

SHAPES = [(8960 * 2, 1536), (1536, 8960), (2048, 1536), (1536, 1536)]
ROWS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=28)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    linears = []
    for _ in range(args.layers):
        for n, k in SHAPES:
            d = torch.rand(n, k // 32) * 0.01
            linears.append(W4A8Linear(torch.randint(0, 16, (n, k), dtype=torch.uint8), d, -8 * d))
    xs = {k: {m: torch.randn(m, k, dtype=torch.bfloat16) for m in ROWS} for k in (1536, 8960)}

    def once(m: int) -> float:
        start = time.perf_counter()
        for lin in linears:
            lin(xs[lin.shape[1]][m])
        return time.perf_counter() - start

    best = {}
    for m in ROWS:
        once(m)
        best[m] = 1e3 * min(once(m) for _ in range(5))
    mb = sum(lin.nbytes for lin in linears) / 1e6
    print(f"{mb:.0f} MB of 4-bit weights;", " ".join(f"{m}: {t:.1f} ms ({t / best[1]:.2f})" for m, t in best.items()))


if __name__ == "__main__":
    main()
