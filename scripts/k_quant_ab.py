"""A GGUF target's K-quants as stored (q4k, w6a8) against the forms they replaced (Q4_K as w4a8 blocks with
fp16-rounded scales, Q6_K re-rounded to w8a8), both loaded in one process and timed interleaved, call by
call: the k-row forward after a 200-token context, min and median ms over N pairs, and whether the two
give the same greedy ids on the rows.

    python scripts/k_quant_ab.py --target qwen2.5-coder-1.5b [--pairs 40] [--rows 1,2,3,5,9,17]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import quickdraft.runtime.quant.gguf_linears as gguf_linears
from quickdraft.host import machine_info
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.quant.w4a8 import W4A8Linear
from quickdraft.runtime.quant.w8a8 import w8a8_linear
from quickdraft.runtime.target import load_target
from quickdraft.weights.loading import load_model


def replaced_form(form: tuple, q8: str, q4: str):
    """The kernel form before K-quants ran as stored (for the A/B only)."""
    if form[0] == "q4k":
        codes, sc, mn, d, dmin = form[1:]
        return W4A8Linear(codes, d.repeat_interleave(8, 1) * sc.float(), -dmin.repeat_interleave(8, 1) * mn.float())
    if form[0] == "q6":
        codes, sc, d = form[1:]
        scale = d.repeat_interleave(16, 1) * sc.float()
        return w8a8_linear(scale.repeat_interleave(16, 1) * (codes.float() - 32))
    return stored_form(form, q8, q4)


stored_form = gguf_linears._kernel_form


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--rows", default="1,2,3,5,9,17")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    quantize = parse_quantize("w4a8")
    models = {"stored": load_target(load_model(args.target, "bfloat16"), "auto", quantize).target}
    gguf_linears._kernel_form = replaced_form
    models["replaced"] = load_target(load_model(args.target, "bfloat16"), "auto", quantize).target
    gguf_linears._kernel_form = stored_form
    prompt = [(i * 37) % 1000 + 10 for i in range(200)]
    out = {"machine": machine_info(), "target": args.target, "rows": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        tokens = list(range(100, 100 + rows))
        times: dict[str, list[float]] = {name: [] for name in models}
        ids = {}
        for m in models.values():
            m.prefill(prompt)
        for _ in range(args.pairs):
            for name, m in models.items():
                t0 = time.perf_counter()
                ids[name] = m.extend(tokens).argmax(-1)
                times[name].append(1000 * (time.perf_counter() - t0))
                m.rollback(len(prompt))
        out["rows"][rows] = {
            **{
                name: {"min_ms": round(min(v), 2), "median_ms": round(statistics.median(v), 2)}
                for name, v in times.items()
            },
            "same_ids": bool(torch.equal(ids["stored"], ids["replaced"])),
        }
        print(rows, out["rows"][rows], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
