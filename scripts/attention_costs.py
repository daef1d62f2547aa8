"""The `attend` kernel against torch's flash SDPA over one layer's cache, at prefill chunks and verify widths
of a long context (issue #79 item 4): milliseconds a call (best of --repeat), by rows, context and dtype,
for a head layout (default: Qwen2.5 1.5B's, 12 query heads over 2 kv heads of 128). The rule that picks
between them for a prefill is `runtime/kernels/attention.long_attention`; this is what it rests on.

    python scripts/attention_costs.py --out docs/bench/long-attention-amx/costs.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.host import cpu_features, cpu_model
from quickdraft.runtime import kernels
from quickdraft.runtime.forward.llama_block import causal_mask
from quickdraft.runtime.kernels.attention import attend

CASES = [(0, 128), (0, 512), (0, 1024), (0, 2048), (6000, 2048), (14000, 2048), (16000, 1), (16000, 9), (16000, 33)]


def best(call, repeat: int) -> float:
    """The fastest of `repeat` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for at, n in CASES:
            k = torch.randn(args.kv_heads, at + n, args.head_dim, dtype=dtype)
            v = torch.randn_like(k)
            q = torch.randn(n, args.heads, args.head_dim, dtype=dtype)
            mask = causal_mask(n, at, "cpu")
            qt = q.transpose(0, 1)[None]
            ours = best(functools.partial(attend, q, k, v, at + n, mask), args.repeat)
            sdpa_call = functools.partial(
                F.scaled_dot_product_attention, qt, k[None], v[None], attn_mask=mask, enable_gqa=True
            )
            sdpa = best(sdpa_call, args.repeat)
            rows.append({"dtype": name, "context": at + n, "rows": n, "kernel_ms": ours, "sdpa_ms": sdpa})
            print(f"{name} rows {n} context {at + n}: kernel {ours:.2f} ms, SDPA {sdpa:.2f} ms", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    host = {"cpu": cpu_model(), "level": kernels.chosen_level(),
            "amx": "amx_bf16" in cpu_features(), "threads": torch.get_num_threads()}  # fmt: skip
    heads = [args.heads, args.kv_heads, args.head_dim]
    out.write_text(json.dumps({"host": host, "heads": heads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
