"""Time the batched target forward of B plain rows (width 1, every row after 200 cached tokens) on the
embedded default or a named target: milliseconds a forward and rows a second at each B, the median of
four passes after a warm-up, the sizes interleaved pass by pass. Run it on two trees with PYTHONPATH to
A/B a change to the batched forward (docs/performance.md, "Many clients").

    python scripts/batch_forward_costs.py --batches 1,8,16,32,64 --threads 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from quickdraft.engine import Engine
from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="a named target or folder (default: the embedded one)")
    p.add_argument("--batches", default="1,8,16,32,64", help="batch sizes, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--passes", type=int, default=4)
    args = p.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    engine = Engine.load(args.target, threads=args.threads)
    target = BatchedTarget(engine.target, max(sizes))
    probe = [3 + i for i in range(200)]
    target.prefill(probe, first=True)
    for _ in range(max(sizes)):
        target.adopt()
    lengths = list(target.cache.lengths)
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(args.passes + 1):
        for b in sizes:
            target.cache.lengths = lengths[:b]  # the first b rows run; nothing is committed
            start = time.perf_counter()
            target.forward([RowBlock(probe[:1]) for _ in range(b)])
            times[b].append(time.perf_counter() - start)
    print(f"host: {platform.processor() or platform.machine()}, {engine.target_info.name}, {engine.config.quantize}")
    for b in sizes:
        m = statistics.median(times[b][1:])
        print(f"{b:3d} rows: {m * 1e3:7.1f} ms a forward, {b / m:6.0f} rows/s")


if __name__ == "__main__":
    main()
