"""Offline tokens per target forward of the suffix drafter on stored plain-decoding outputs.

Greedy verification accepts the longest drafted path that equals the target's own continuation, so a
deterministic drafter's tokens per forward follow from a bench run's `ar` rows without running the
model (as `../shared/tools/suffix_sim.py` does for a reference trie). This drives the real
`SuffixDrafter` and also times its drafting per round.

    python scripts/suffix_offline.py docs/bench/quick-reuse-csd-specdec/results.jsonl.xz --budgets 4,8,16
    python scripts/suffix_offline.py RESULTS.jsonl --spec "suffix;match=16"   # any suffix spec
"""

from __future__ import annotations

import argparse
import json
import lzma
import time

import numpy as np

from quickdraft.drafters import make_drafter
from quickdraft.weights.loading import load_model


def plain_rows(path: str) -> list[dict]:
    rows = [json.loads(line) for line in (lzma.open(path, "rt") if str(path).endswith(".xz") else open(path))]
    seen: dict = {}
    for r in rows:
        if r["method"] == "ar" and r.get("run", 0) == 0:
            seen.setdefault(r["question_id"], r)
    return list(seen.values())


def accepted(paths: list[tuple[int, ...]], truth: list[int]) -> int:
    best = 0
    for path in paths:
        d = 0
        while d < len(path) and d < len(truth) and path[d] == truth[d]:
            d += 1
        best = max(best, d)
    return best


def simulate(drafter, rows: list[dict], budget: int) -> tuple[float, float]:
    """(tokens per forward, mean ms of drafting per round)."""
    tokens = forwards = 0
    spent = []
    for r in rows:
        prompt, out = r["prompt_ids"], r["token_ids"]
        drafter.begin(prompt)
        i = 1  # the first token comes from prefill
        tokens, forwards = tokens + 1, forwards + 1
        while i < len(out):
            start = time.perf_counter()
            paths = drafter.candidates(prompt + out[:i], min(budget, len(out) - i - 1)) if len(out) - i > 1 else []
            spent.append(time.perf_counter() - start)
            step = min(accepted(paths, out[i:]) + 1, len(out) - i)
            tokens, forwards, i = tokens + step, forwards + 1, i + step
    return tokens / forwards, 1000 * float(np.mean(spent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    parser.add_argument("--spec", default="suffix")
    parser.add_argument("--budgets", default="1,4,8,16,32")
    args = parser.parse_args()
    target = load_model(None, "bfloat16")
    drafter = make_drafter(args.spec, target)
    for path in args.results:
        rows = plain_rows(path)
        print(f"{path}: {len(rows)} prompts, {sum(len(r['token_ids']) for r in rows)} tokens, spec {args.spec}")
        for budget in (int(b) for b in args.budgets.split(",")):
            tpf, ms = simulate(drafter, rows, budget)
            print(f"  {budget:3d} nodes: {tpf:.2f} tokens/forward, drafting {ms:.2f} ms/round", flush=True)


if __name__ == "__main__":
    main()
