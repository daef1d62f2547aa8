"""Where a speculative round's time goes on the Qwen2.5-Coder pair: every target and draft forward (by
model and rows), the draft's propose, the verify forward, the argmax and the round, timed call by call
over two greedy generations of one HumanEval problem (the second is the steady state).

    python scripts/pair_round_profile.py [--drafter "model:qwen2.5-coder-0.5b;quant=w4a8-all;vocab=32768"]

Prints each timed call's count, total and median. docs/benchmarks.md ("The Qwen2.5-Coder pair") quotes it.
"""

import argparse
import collections
import statistics
import time

import torch

from quickdraft.bench.datasets import load_prompts
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import round as rnd
from quickdraft.drafters.draft_models.model_drafter import ModelDrafter
from quickdraft.engine import Engine
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.settings.options import options_from

T: dict[str, list[float]] = collections.defaultdict(list)


def timed(cls, name: str, key: str) -> None:
    real = getattr(cls, name)

    def wrapper(self, *a, **k):
        start = time.perf_counter()
        out = real(self, *a, **k)
        T[key].append(time.perf_counter() - start)
        return out

    setattr(cls, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafter", default="model:qwen2.5-coder-0.5b;quant=w4a8-all;vocab=32768")
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    real_forward = NativeCachedModel.forward

    def forward(self, tokens, *a, **k):
        start = time.perf_counter()
        out = real_forward(self, tokens, *a, **k)
        T[f"forward, {len(self.net.layers)} layers, {min(len(tokens), 9)} rows (9: 9 or more)"].append(
            time.perf_counter() - start
        )
        return out

    NativeCachedModel.forward = forward
    timed(rnd.RoundLoop, "step", "round")
    timed(rnd.RoundLoop, "_argmax", "argmax")
    timed(rnd.SoloTarget, "run", "verify forward")
    timed(ModelDrafter, "propose", "draft propose")
    config = options_from(dict(method="sd", quantize="w4a8", drafter=args.drafter, threads=2))
    engine = Engine.load(args.target, config)
    ids = engine.encode(load_prompts("humaneval", None, None)[1].prompt)
    for run in range(2):
        T.clear()
        start = time.perf_counter()
        out = engine.generate_ids(ids, SamplingConfig(), StopConfig(args.tokens))
        print(f"run {run}: {len(out.token_ids)} tokens in {time.perf_counter() - start:.2f} s")
        for key, v in sorted(T.items()):
            print(f"  {key}: n={len(v)} total={sum(v):.3f} s median={1e3 * statistics.median(v):.1f} ms")


if __name__ == "__main__":
    main()
