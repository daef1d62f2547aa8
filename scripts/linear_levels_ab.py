"""Time one build of the fused kernels' linears on the Qwen2.5-Coder-1.5B layer's shapes: an A/B of two
builds (e.g. before and after a kernel change), each loaded by its path in its own process.

For each weight form (q4k, w6a8, w4a8, w8a8, bf16) and row count (1, 2, 3, 5, 9, 17, 33): the median
over 7 repeats of the ms one layer's four linears take (q|k|v 2048x1536, o 1536x1536, gate|up
17920x1536, down 1536x8960), over 4 random copies of each weight so they stream from memory as in a
real step. Random codes and scales: this times the kernels, it checks nothing (tests/test_kernels.py
and tests/test_k_quants.py do).

    python scripts/linear_levels_ab.py ~/.cache/quickdraft/kernels/avx2-<key>/quickdraft_fused_avx2.so out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
COPIES = 4
ROWS = (1, 2, 3, 5, 9, 17, 33)


def load(path: Path):
    """The kernel module built at `path` (its module name is the file's stem)."""
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights(ops, n: int, k: int) -> dict:
    """One (n, k) weight in every form, random."""
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    sc, mn = (torch.randint(0, 64, (n, k // 32), dtype=torch.uint8) for _ in range(2))
    d, dmin = torch.rand(n, k // 256) * 1e-3, torch.rand(n, k // 256) * 1e-3
    q6 = torch.randint(0, 64, (n, k), dtype=torch.uint8)
    s6 = torch.randint(-60, 60, (n, k // 16), dtype=torch.int8)
    return {
        "q4k": ops.pack_q4k(codes, sc, mn, d, dmin),
        "w6a8": ops.pack_q6(q6, s6, d.clone()),
        "w4a8": ops.pack_q4(codes, torch.rand(n, k // 32) * 1e-2, -torch.rand(n, k // 32) * 1e-2),
        "w8a8": (
            ops.pack_int8(torch.randint(-127, 128, (n, k), dtype=torch.int8)),
            ops.pack_blocks(torch.rand(n, k // 32) * 1e-3),
        ),
        "bf16": ops.pack_bf16(torch.randn(n, k, dtype=torch.bfloat16) * 0.02),
    }


def kernel_calls(ops) -> dict:
    """{form: (x, `weights`'s dict, n) -> the kernel's output}."""
    return {
        "q4k": lambda x, w, n: ops.linear_q4k(x, w["q4k"], n),
        "w6a8": lambda x, w, n: ops.linear_w6a8(x, w["w6a8"], n),
        "w4a8": lambda x, w, n: ops.linear_w4a8(x, w["w4a8"], n),
        "w8a8": lambda x, w, n: ops.linear_w8a8(x, *w["w8a8"], n),
        "bf16": lambda x, w, n: ops.linear_packed(x, w["bf16"], n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("library", type=Path, help="a build's quickdraft_fused_<level>.so")
    ap.add_argument("out", type=Path, help="JSON: {form@rows: ms a layer}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forms", default="q4k,w6a8,w4a8,w8a8,bf16", help="comma-separated weight forms to time")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ops = load(args.library)
    calls = {form: kernel_calls(ops)[form] for form in args.forms.split(",")}
    layer = {name: [weights(ops, n, k) for _ in range(COPIES)] for name, (n, k) in SHAPES.items()}
    out = {}
    for rows in map(int, args.rows.split(",")):
        for form, call in calls.items():
            times = []
            for _ in range(7):
                start = time.perf_counter()
                for name, (n, k) in SHAPES.items():
                    x = torch.randn(rows, k, dtype=torch.bfloat16)
                    for w in layer[name]:
                        call(x, w, n)
                times.append(time.perf_counter() - start)
            out[f"{form}@{rows}"] = round(statistics.median(times) * 1000 / COPIES, 3)
            print(form, rows, out[f"{form}@{rows}"], flush=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
