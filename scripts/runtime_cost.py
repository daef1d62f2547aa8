"""Per-step cost of the native and the Hugging Face forward, target and shipped draft, and the
native step's profile: `python scripts/runtime_cost.py --threads 2 [--dtype bfloat16]`.

Prints the median milliseconds of a cached forward over k = 1, 4, 8 new tokens after a 64-token
context (one model at a time, interleaved runtimes), transformers' own generate() per token, and the
top operators of torch.profiler over 20 native single-token steps.
"""

from __future__ import annotations

import argparse
import time

import torch

from quickdraft.drafters import make_drafter
from quickdraft.runtime.choose import cached_model
from quickdraft.weights.loading import load_model


def step_ms(model, k: int, repeats: int = 25) -> float:
    model.prefill(list(range(100, 164)))
    for _ in range(3):
        model.extend([5] * k, last_only=k == 1)
        model.rollback(64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.extend([5] * k, last_only=k == 1)
        times.append(time.perf_counter() - start)
        model.rollback(64)
    return 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(None, args.dtype)
    flags = open("/proc/cpuinfo").read()
    print(f"torch {torch.__version__}, {args.threads} threads, {args.dtype}, avx512_bf16: {'avx512_bf16' in flags}")
    for runtime in ("hf", "native", "hf", "native"):
        t = cached_model(target.model, target.vocab_size, runtime=runtime)
        draft = make_drafter("distilled", target, "", runtime).model
        cells = ", ".join(f"k={k} {step_ms(t, k):.2f}" for k in (1, 4, 8))
        print(f"{runtime:6s} target ms/forward: {cells}; distilled draft step {step_ms(draft, 1):.2f}")
    ids = torch.tensor([list(range(100, 164))])
    for _ in range(2):
        start = time.perf_counter()
        target.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=False,
            pad_token_id=2,
        )
        print(f"transformers generate(): {1000 * (time.perf_counter() - start) / 64:.2f} ms/token (prefill included)")
    native = cached_model(target.model, target.vocab_size, runtime="native")
    native.prefill(list(range(100, 164)))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            native.extend([5], last_only=True)
            native.rollback(64)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
