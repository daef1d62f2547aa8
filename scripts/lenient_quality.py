"""Speed and quality of lenient (lossy) verification against lossless SD and plain sampling.

Lenience only acts when sampling (at temperature 0 p and q are one-hot and nothing changes), so
"match rate against plain decoding" is undefined here: two correct samplers disagree token by token.
Quality is measured instead as the mean log-probability, under the target's processed p, of the
tokens each method emits (scored afterwards in float32), next to tokens/s and acceptance.
Lossless SD must match plain sampling on it within noise; lenient runs show how far they drift.

Usage: python scripts/lenient_quality.py --drafter distilled:PATH --lenience 0.5 0.25 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from quickdraft.bench.datasets import load_prompts
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.engine import Engine, EngineConfig
from quickdraft.sampling import logits_to_probs
from quickdraft.weights.loading import load_model


@torch.no_grad()
def mean_logp(model, prompt: list[int], out: list[int], sampling: SamplingConfig) -> tuple[float, int]:
    ids = torch.tensor([prompt + out])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    p = logits_to_probs(logits, sampling)
    lp = p.gather(-1, torch.tensor(out).unsqueeze(-1)).clamp_min(1e-30).log()
    return float(lp.sum()), len(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--draft-length", type=int, default=2)
    ap.add_argument("--lenience", type=float, nargs="+", default=[0.5, 0.25])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", default="spec_bench")
    ap.add_argument("--limit", type=int, default=1, help="prompts per category")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(None, args.dtype)
    scorer = load_model(None, "float32").model
    records = load_prompts(args.prompts, None, args.limit)
    draft = DraftConfig(num_draft_tokens=args.draft_length)
    methods = {"ar (plain sampling)": Engine(target, EngineConfig(method="ar"), dtype=args.dtype)}
    sd = Engine(target, EngineConfig(method="sd", drafter=args.drafter, draft=draft), dtype=args.dtype)
    methods["sd (lossless)"] = sd
    for lv in args.lenience:
        cfg = EngineConfig(method="sd", drafter=args.drafter, draft=draft, verifier=f"lenient:{lv:g}")
        methods[f"sd lenient:{lv:g} (LOSSY)"] = Engine(target, cfg, drafter=sd.drafter, dtype=args.dtype)
    rows = {m: {"tokens": 0, "wall": 0.0, "logp": 0.0, "drafted": 0, "accepted": 0, "per_prompt": []} for m in methods}
    for rec in records:
        ids = sd.encode(rec.prompt)
        for seed in range(args.seeds):
            sampling = SamplingConfig(temperature=args.temperature, seed=seed)
            for name, eng in methods.items():
                res = eng.generate_ids(ids, sampling, StopConfig(args.max_new_tokens, target.eos_token_ids))
                lp, n = mean_logp(scorer, ids, res.token_ids, sampling)
                r = rows[name]
                r["tokens"] += n
                r["wall"] += res.stats.wall_s
                r["logp"] += lp
                r["drafted"] += res.stats.num_draft_tokens
                r["accepted"] += res.stats.num_accepted_draft_tokens
                r["per_prompt"].append(lp / max(n, 1))
    base = rows["ar (plain sampling)"]["tokens"] / rows["ar (plain sampling)"]["wall"]
    print(
        f"temperature {args.temperature}, drafter {args.drafter}, gamma {args.draft_length}, "
        f"{len(records)} prompts x {args.seeds} seeds, {args.dtype}, {args.threads} threads"
    )
    print("| method | tokens/s | speedup | draft acceptance | mean target log p per token (± s.e.) |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, r in rows.items():
        tps = r["tokens"] / r["wall"]
        acc = r["accepted"] / r["drafted"] if r["drafted"] else float("nan")
        se = statistics.stdev(r["per_prompt"]) / len(r["per_prompt"]) ** 0.5
        mlp = r["logp"] / r["tokens"]
        print(f"| {name} | {tps:.2f} | {tps / base:.2f}x | {acc:.3f} | {mlp:.3f} ± {se:.3f} |")
        summary[name] = {"tokens_per_s": tps, "speedup": tps / base, "acceptance": acc, "mean_logp": mlp, "se": se}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "methods": summary}, f, indent=1)


if __name__ == "__main__":
    main()
