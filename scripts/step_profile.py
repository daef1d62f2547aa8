"""Our target step, measured and profiled: ms per one-row step (plain greedy decoding), the cost curve
of a k-row forward (1-33 rows, as multiples of one row), and torch.profiler's top ops of a step of
`--profile-rows` rows (aten's ops only: the fused kernels' own time shows under `perf record`, as in
docs/bench/q4k-tiles-amx). The floor work (issue "The target's step at the hardware's floor") compares these before and
after each change.

    python scripts/step_profile.py [--target NAME] [--quantize none|int8|gguf|w4a8] [--threads 2] [--context 200]
    QUICKDRAFT_FAST_BLOCK=0 python scripts/step_profile.py    # the block without the fused kernels
"""

from __future__ import annotations

import argparse
import json

import torch

from quickdraft.host import machine_info, median_seconds
from quickdraft.runtime import kernels
from quickdraft.runtime.kernels.linear import packing
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.target import load_target
from quickdraft.weights.loading import load_model

ROWS = (1, 2, 3, 5, 9, 17, 33)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="a registry name or folder (default: the embedded default)")
    ap.add_argument("--quantize", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-rows", type=int, default=1, help="rows a profiled step extends (9: a verify)")
    ap.add_argument("--curve-only", type=int, nargs="*", default=None, help="measure only these rows")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.target, "bfloat16")
    target = load_target(loaded, "auto", parse_quantize(args.quantize)).target
    prompt = [(i * 37) % 1000 + 10 for i in range(args.context)]

    def step_ms(rows: int) -> float:
        target.prefill(prompt)
        tokens = list(range(100, 100 + rows))

        def once() -> None:
            target.extend(tokens)
            target.rollback(len(prompt))

        return 1000 * median_seconds(once, repeats=20, warmup=3)

    curve = {k: step_ms(k) for k in sorted({1, *(args.curve_only or ROWS)})}
    one = curve[1]
    host, ops = machine_info(), kernels.fused_ops()
    paths = (
        "fused kernels off" if ops is None else f"vdpbf16ps {ops.has_avx512_bf16()}, vpdpbusd {ops.has_avx512_vnni()}"
    )
    print(
        f"{host['cpu']} {host['cpu_flags']} threads={args.threads} target={args.target or 'default'} "
        f"quantize={args.quantize} context={args.context}"
    )
    print(f"packed linear: {packing()}; fused kernels: {paths}")
    print(f"one-row step: {one:.2f} ms")
    print("rows: " + "  ".join(f"{k}: {v / one:.2f}" for k, v in curve.items()))
    if not args.no_profile:
        target.prefill(prompt)
        rows = list(range(100, 100 + args.profile_rows))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(32):
                target.extend(rows, last_only=args.profile_rows == 1)
                target.rollback(len(prompt))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
        print(f"torch.profiler, 32 steps of {args.profile_rows} rows, by self CPU time:")
        print(table)
        events = prof.key_averages()
        print(f"ops per step: {sum(e.count for e in events) / 32:.0f}")
    print(json.dumps({"one_row_ms": round(one, 3), "curve": {k: round(v / one, 3) for k, v in curve.items()}}))


if __name__ == "__main__":
    main()
