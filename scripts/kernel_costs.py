"""The kernels of one target step, each timed alone: what a profile of the step is made of.

For SmolLM2-135M's shapes (30 layers of q|k|v 960x576, o 576x576, gate|up 3072x576, down 576x1536, a
49152x576 LM head): all the linears of a step in each weight form (bf16 packed, w8a8, w4a8; 30
distinct weights a shape, so they stream from memory as in a real step), and the fused attention,
norm, SwiGLU and RoPE kernels, at 1 and 17 rows after 200 cached positions. Their sum against the
step (`scripts/step_profile.py`) is what Python and small torch ops cost between them.

    python scripts/kernel_costs.py [--threads 2] [--rows 1,17]
"""

from __future__ import annotations

import argparse

import torch

from quickdraft.host import machine_info, median_seconds
from quickdraft.runtime import kernels
from quickdraft.runtime.quant.w4a8 import w4a8_linear
from quickdraft.runtime.quant.w8a8 import w8a8_linear

SHAPES = {"qkv": (960, 576, 30), "o": (576, 576, 30), "gate_up": (3072, 576, 30), "down": (576, 1536, 30)}
HEAD = (49152, 576, 1)


def linears_ms(form: str, rows: int, ops) -> dict[str, float]:
    """ms for every linear of one step in `form`, by shape."""
    out = {}
    for name, (n, k, count) in {**SHAPES, "head": HEAD}.items():
        weights = [torch.randn(n, k) for _ in range(count)]
        if form == "bf16":
            packed = [ops.pack_bf16(w.bfloat16()) for w in weights]
            calls = [lambda x, p=p, n=n: ops.linear_packed(x, p, n) for p in packed]
        else:
            make = w8a8_linear if form == "w8a8" else w4a8_linear
            calls = [make(w) for w in weights]
        x = torch.randn(rows, k, dtype=torch.bfloat16)

        def run(calls=calls, x=x) -> None:
            for call in calls:
                call(x)

        out[name] = 1e3 * median_seconds(run, repeats=7, warmup=2)
    return out


def small_ms(rows: int, ops, context: int = 200) -> dict[str, float]:
    """ms for the fused small kernels of one step (30 layers)."""
    heads, kv, d, hidden = 9, 3, 64, 576
    kc, vc = torch.randn(kv, 2048, d, dtype=torch.bfloat16), torch.randn(kv, 2048, d, dtype=torch.bfloat16)
    length = context + rows
    q = torch.randn(rows, heads, d, dtype=torch.bfloat16)
    mask = torch.ones(rows, length, dtype=torch.bool).tril(context)
    x, h, w = (torch.randn(rows, hidden, dtype=torch.bfloat16) for _ in range(3))
    w = w[0].contiguous()
    gu = torch.randn(rows, 3072, dtype=torch.bfloat16)
    y, cos = torch.randn(rows, (heads + 2 * kv) * d, dtype=torch.bfloat16), torch.randn(rows, d, dtype=torch.bfloat16)
    timed = {
        "attend": (lambda: ops.attend(q, kc, vc, length, mask), 30),
        "add_rms_norm": (lambda: ops.add_rms_norm(x, h, w, 1e-5), 61),
        "silu_mul": (lambda: ops.silu_mul(gu), 30),
        "rope_store": (lambda: ops.rope_store(y, cos, cos, kc, vc, context, heads, kv), 30),
    }
    return {name: 1e3 * count * median_seconds(fn, repeats=20, warmup=3) for name, (fn, count) in timed.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,17")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = kernels.fused_ops()
    if ops is None:
        raise SystemExit("the fused kernels are not available here")
    host = machine_info()
    print(f"{host['cpu']} {host['cpu_flags']}, {args.threads} threads; ms per step (all layers)")
    for rows in (int(r) for r in args.rows.split(",")):
        for form in ("bf16", "w8a8", "w4a8"):
            ms = linears_ms(form, rows, ops)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
            print(f"{rows} rows, {form} linears: {sum(ms.values()):.2f} ms ({parts})")
        small = small_ms(rows, ops)
        print(f"{rows} rows, small kernels: " + ", ".join(f"{k} {v:.2f}" for k, v in small.items()))


if __name__ == "__main__":
    main()
