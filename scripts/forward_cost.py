"""What forwards cost on this machine, the two numbers that decide whether speculation pays.

1. One target forward over k new tokens (KV cache of 200) as a multiple of k = 1: verifying k
   drafts costs one forward over k+1 tokens.
2. One draft step (a truncated 6-layer copy of the target): a bare HF forward with a cache, our
   CachedModel.extend, and transformers' generate() per token, to show the draft loop adds little.

Usage: python scripts/forward_cost.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.weights.loading import load_model, truncated_copy


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
    draft_step_costs(m, args.repeats)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


@torch.inference_mode()
def draft_step_costs(target, repeats: int) -> None:
    from transformers import DynamicCache

    draft = truncated_copy(target, 6).model
    ctx = torch.arange(100, 300)[None]
    cache = DynamicCache(config=draft.config)
    draft(input_ids=ctx, past_key_values=cache)
    tok = torch.tensor([[500]])

    def bare():
        draft(input_ids=tok, past_key_values=cache, logits_to_keep=1)
        cache.crop(-1)

    cm = CachedModel(draft)
    cm.extend(ctx[0].tolist())

    def ours():
        cm.extend([500], last_only=True)
        cm.rollback(200)

    def hf_generate(n: int):
        return lambda: draft.generate(
            input_ids=ctx,
            attention_mask=torch.ones_like(ctx),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )

    def prefill():
        draft(input_ids=ctx, past_key_values=DynamicCache(config=draft.config), logits_to_keep=1)

    reps = max(5, repeats // 3)
    one, nine, pre = _median_ms(hf_generate(1), reps), _median_ms(hf_generate(9), reps), _median_ms(prefill, reps)
    print("draft step, 6-layer truncated copy:")
    print(f"  bare forward with cache          {_median_ms(bare, repeats):7.2f} ms")
    print(f"  CachedModel.extend (our drafter) {_median_ms(ours, repeats):7.2f} ms")
    print(f"  generate(), per new token        {(nine - one) / 8:7.2f} ms  ((9 tokens - 1 token) / 8)")
    print(f"  generate(), per-call set-up      {one - pre:7.2f} ms  (1-token call minus a bare prefill)")


if __name__ == "__main__":
    main()
