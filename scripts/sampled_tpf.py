"""Tokens per target forward when sampling (the bench times greedy decoding only).

    python scripts/sampled_tpf.py --temperature 0.7 --drafters "suffix,suffix;tree=0,ngram" --seeds 2

Runs the Spec-Bench quick set (one prompt per category, 64 new tokens) through each drafter at the
given temperature with seeds 0..N-1 and prints new tokens / target forwards per drafter (speculative
sampling is lossless, so acceptance, not the output law, is what changes with the drafter).
"""

from __future__ import annotations

import argparse

import torch

from quickdraft import Engine
from quickdraft.bench.datasets import load_prompts
from quickdraft.settings.options import options_from


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--drafters", default="suffix,ngram", help="drafter specs; ';tree=N' sets draft_tree")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = [r.prompt for r in load_prompts("spec_bench", limit=1)]
    for item in args.drafters.split(","):
        spec, _, tree = item.partition(";tree=")
        options = {"drafter": spec, **({"draft_tree": tree} if tree else {})}
        engine = Engine.load(config=options_from(options))
        tokens = forwards = 0
        for seed in range(args.seeds):
            for prompt in prompts:
                out = engine.generate(
                    prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed
                )
                tokens += out.stats.num_new_tokens
                forwards += out.stats.num_target_forwards
        print(
            f"{item}: T={args.temperature}, {len(prompts)} prompts x {args.seeds} seeds: "
            f"{tokens / forwards:.2f} tokens per target forward",
            flush=True,
        )


if __name__ == "__main__":
    main()
