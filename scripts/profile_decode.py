"""Profile one decoding configuration on Spec-Bench `--quick`'s prompts (13, one per category) or
HumanEval's: tokens per second of a warm pass, then cProfile of a second pass, its top functions by
cumulative time (or `--sort tottime`).

    python scripts/profile_decode.py "drafter=head"                       # the head, draft_tree auto
    python scripts/profile_decode.py "drafter=head;draft_tree=2;tree_width=1" --filter "feature_head|reuse|tree"
    python scripts/profile_decode.py "method=ar;quantize=w4a8" --target qwen2.5-coder-1.5b \
        --prompts humaneval --limit 1 --max-new-tokens 128 --temperature 0.8 --sort tottime

Options are `;`-separated engine options by name (as in `quickdraft.generate(...)`); the embedded default
in bf16, greedy, 64 new tokens per prompt, 2 threads unless given.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from quickdraft.bench.datasets import load_prompts
from quickdraft.engine import Engine
from quickdraft.settings.options import options_from
from quickdraft.weights.loading import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("options", help='engine options, e.g. "drafter=head;draft_tree=2"')
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--target", default=None, help="a named target (default: the embedded default in bf16)")
    ap.add_argument("--prompts", default="quick", choices=["quick", "humaneval"])
    ap.add_argument("--limit", type=int, default=None, help="HumanEval's first N problems")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--filter", default="", help="regex on file:function of the lines shown")
    ap.add_argument("--out", default="/tmp/quickdraft-decode.prof")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    values = dict(item.split("=", 1) for item in args.options.split(";") if item)
    if args.target:
        engine = Engine.load(args.target, options_from(values))
    else:
        engine = Engine(load_model(None, "bfloat16"), options_from(values))
    if args.prompts == "humaneval":
        prompts = [r.prompt for r in load_prompts("humaneval", None, args.limit)]
    else:
        prompts = [r.prompt for r in load_prompts("spec_bench", limit=1)]

    def run() -> tuple[int, float, int]:
        tokens = forwards = 0
        start = time.perf_counter()
        for prompt in prompts:
            out = engine.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=1)
            tokens, forwards = tokens + out.stats.num_new_tokens, forwards + out.stats.num_target_forwards
        return tokens, time.perf_counter() - start, forwards

    run()  # warm: caches, the cost curve, the auto budget
    tokens, seconds, forwards = run()
    print(f"{tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tokens/s, {tokens / forwards:.2f} per forward")
    cProfile.runctx("run()", globals(), {"run": run}, args.out)
    stats = pstats.Stats(args.out).sort_stats(args.sort)
    stats.print_stats(*([args.filter] if args.filter else []), args.top)


if __name__ == "__main__":
    main()
