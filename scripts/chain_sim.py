"""How long a draft model's chains should be on this host, offline: every chain-stopping rule replayed
on the target's own greedy outputs, priced with this host's measured costs.

A greedy chain from position t drafts the draft model's argmax tokens; while they equal the target's
tokens (the bench's stored `ar` outputs), the draft sees exactly the teacher-forced context, so one
forward of the draft over prompt + output gives, at every position, the top-1 probability its stopping
rule reads and whether its token is accepted. A round from t commits its accepted prefix plus one and
costs the verify forward over its rows (this host's curve, one-row steps) plus its draft steps (after
the first miss the draft's own tokens differ from the teacher-forced ones: their probabilities are
approximated by the teacher-forced ones, which only moves where a rule stops, never what is accepted).

    python scripts/chain_sim.py docs/bench/pair-humaneval24-avx2/results.jsonl.xz [--drafter DW]

Prints, per rule, tokens per step of the decode phase (prefill excluded) and tokens a round, plus the
draft's calibration (mean top-1 probability against the acceptance rate, by probability bin).
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics

import torch

from quickdraft.decoding.adaptive import CostStop
from quickdraft.decoding.parts import host_costs, round_cost
from quickdraft.engine import Engine
from quickdraft.settings.options import options_from

DW = "model:qwen2.5-coder-0.5b;quant=w4a8-all;vocab=32768;window=256"


def outputs(path: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy output ids) of the run's `ar` rows."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [(r["prompt_ids"], r["token_ids"]) for r in rows if r["method"] == "ar" and "prompt_ids" in r]


def teacher_forced(drafter, prompt: list[int], out: list[int]) -> tuple[list[float], list[bool]]:
    """The draft's top-1 probability and whether its argmax is the target's token, at every output position."""
    logits = drafter.review(prompt, out[:-1])  # (len(out), V): rows predicting out[0..]
    probs = torch.softmax(logits.float(), -1)
    top = probs.max(-1)
    return top.values.tolist(), [int(i) == t for i, t in zip(top.indices.tolist(), out, strict=True)]


def replay(seqs, keep_factory, cap: int, price) -> tuple[float, float]:
    """(tokens per one-row step, tokens per round) of chains up to `cap` stopped by keep_factory(), each
    round priced by price(rows, drafted) (`round_cost`: what the draft guard and the cost schedule read)."""
    tokens = cost = rounds = 0.0
    for ps, hits in seqs:
        t = 0
        while t < len(ps):
            keep, n, accepted, missed = keep_factory(), 0, 0, False
            while t + n < len(ps):
                n += 1
                if not missed and hits[t + n - 1]:
                    accepted += 1
                else:
                    missed = True
                if n == cap or (keep is not None and not keep(ps[t + n - 1], n)):
                    break
            committed = min(accepted + 1, len(ps) - t)
            tokens, rounds = tokens + committed, rounds + 1
            cost += price(n + 1, n)
            t += committed
    return tokens / cost, tokens / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafter", default=DW)
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    engine = Engine.load(args.target, options_from(dict(method="sd", quantize="w4a8", drafter=args.drafter, threads=2)))
    curve, step, _ = host_costs(engine.parts)
    price = round_cost(engine.parts, True)
    print(f"curve (one-row steps): { {k: round(v, 2) for k, v in sorted(curve.items())} }; draft step {step:.3f}")
    seqs = [teacher_forced(engine.drafter, p, o) for p, o in outputs(args.results)[: args.limit]]
    flat = [(p, h) for ps, hs in seqs for p, h in zip(ps, hs, strict=True)]
    print(f"{len(seqs)} outputs, {len(flat)} positions, acceptance {statistics.mean(h for _, h in flat):.3f}")
    for lo, hi in ((0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.97), (0.97, 1.01)):
        sel = [(p, h) for p, h in flat if lo <= p < hi]
        if sel:
            mean_p, rate = statistics.mean(p for p, _ in sel), statistics.mean(h for _, h in sel)
            print(f"  p in [{lo}, {hi}): {len(sel):5d} positions, mean p {mean_p:.3f}, accepted {rate:.3f}")
    rules = {f"fixed {n}": (lambda: None, n) for n in (1, 2, 3, 4, 6, 8)}
    for n, thr in ((8, 0.5), (8, 0.7), (8, 0.8), (8, 0.9), (4, 0.7), (3, 0.7)):
        rules[f"p-min {n}/{thr}"] = ((lambda thr=thr: lambda p, n: p >= thr), n)
    for cap in (8, 16):
        rules[f"cost {cap}"] = ((lambda cap=cap: CostStop(price, cap).keep), cap)
    for name, (factory, cap) in rules.items():
        rate, per_round = replay(seqs, factory, cap, price)
        print(f"{name:>16}: {rate:.3f} tokens a step (x plain), {per_round:.2f} tokens a round")


if __name__ == "__main__":
    main()
