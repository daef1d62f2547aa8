"""Cost of one target forward over k new tokens (KV cache of 200), as a multiple of k = 1.

This ratio decides whether speculation can pay on a machine: verifying k drafts costs one forward
over k+1 tokens. Usage: python scripts/forward_cost.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.models.cached_model import CachedModel
from quickdraft.models.loading import load_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    m = load_model(args.target, args.dtype)
    cm = CachedModel(m.model, m.vocab_size)
    cm.extend(list(range(100, 300)))
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {args.threads} threads")
    base = None
    for k in (1, 2, 3, 4, 5, 6, 8, 16):
        times = []
        for _ in range(args.repeats):
            cm.rollback(200)
            start = time.perf_counter()
            cm.extend(list(range(500, 500 + k)))
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1000
        base = base or ms
        print(f"k={k:2d}  {ms:7.2f} ms  x{ms / base:.2f}")


if __name__ == "__main__":
    main()
