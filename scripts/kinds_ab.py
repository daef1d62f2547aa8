"""Every drafter kind's output on the README prompt, to compare two commits back to back.

Runs each configuration below through the public API (`quickdraft.Engine`) in float64, greedy and
seeded-sampled, and writes {config: {"greedy": ids, "sampled": ids, "forwards": n}} as JSON. Run it
once per tree (`PYTHONPATH=<tree>/src`) and compare the two files with `--compare OLD NEW`: greedy
outputs must be token-identical; seeded samples are identical too where the random streams are
consumed in the same order.

    PYTHONPATH=/tmp/old/src .venv/bin/python scripts/kinds_ab.py --out /tmp/ab-old.json
    .venv/bin/python scripts/kinds_ab.py --out /tmp/ab-new.json
    .venv/bin/python scripts/kinds_ab.py --compare /tmp/ab-old.json /tmp/ab-new.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

PROMPT = "Write a Python function that returns the sum of a list of numbers, then show an example call."

# (label, engine options): every drafter kind, chains and trees, the chain verifiers and policies
CONFIGS: list[tuple[str, dict]] = [
    ("ar", {"method": "ar"}),
    ("suffix (default, tree auto)", {}),
    ("suffix chain", {"drafter": "suffix", "draft_tree": 0}),
    ("ngram chain", {"drafter": "ngram", "draft_tree": 0}),
    ("ngram chain heuristic", {"drafter": "ngram", "draft_schedule": "heuristic"}),
    ("mag chain", {"drafter": "mag", "draft_tree": 0}),
    ("mix tree", {"drafter": "mix"}),
    ("head tree (auto)", {"drafter": "head"}),
    ("head tree 12", {"drafter": "head", "draft_tree": 12}),
    ("head chain", {"drafter": "head", "draft_tree": 0}),
    ("kangaroo chain", {"drafter": "kangaroo", "draft_tree": 0}),
    ("specdec chain", {"drafter": "specdec", "draft_tree": 0}),
    ("distilled chain", {"drafter": "distilled", "draft_tree": 0}),
    ("distilled chain confidence", {"drafter": "distilled", "draft_schedule": "confidence"}),
    ("distilled tree 8", {"drafter": "distilled", "draft_tree": 8}),
    ("truncated:6 chain", {"drafter": "truncated:6", "draft_tree": 0}),
    ("quant:int8 chain", {"drafter": "quant:int8", "draft_tree": 0}),
    ("ngram+truncated:4 chain", {"drafter": "ngram+truncated:4", "draft_tree": 0}),
    ("csd", {"drafter": "csd"}),
    ("pearl", {"method": "pearl", "drafter": "ngram"}),
    ("hf runtime, ngram chain", {"drafter": "ngram", "draft_tree": 0, "runtime": "hf"}),
    ("specdec verifier, ngram chain", {"drafter": "ngram", "draft_tree": 0, "verifier": "specdec:beta=2,tau=2"}),
]
SAMPLED_ONLY = [
    ("lenient verifier, distilled chain", {"drafter": "distilled", "draft_tree": 0, "verifier": "lenient:0.5"}),
]


def run(out: str, tokens: int, only: str | None) -> None:
    import torch

    from quickdraft import Engine
    from quickdraft.settings.options import options_from

    torch.set_num_threads(2)
    results: dict[str, dict] = {}
    for label, options in CONFIGS + SAMPLED_ONLY:
        if only and only not in label:
            continue
        start = time.perf_counter()
        engine = Engine.load(config=options_from({**options, "dtype": "float64", "guard": False}))
        row: dict = {}
        if (label, options) not in SAMPLED_ONLY:
            greedy = engine.generate(PROMPT, max_new_tokens=tokens)
            row["greedy"], row["forwards"] = greedy.token_ids, greedy.stats.num_target_forwards
            row["budget"] = greedy.stats.extra.get("tree_budget_auto")  # sized from this host's timings
        if not options.get("verifier", "").startswith("specdec"):  # SpecDec's rule is greedy only
            sampled = engine.generate(PROMPT, max_new_tokens=tokens, temperature=0.8, top_p=0.95, seed=7)
            row["sampled"] = sampled.token_ids
        engine.close()
        results[label] = row
        print(f"{label}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(results, f)


def compare(old_path: str, new_path: str) -> int:
    old, new = (json.load(open(p)) for p in (old_path, new_path))
    bad = 0
    print("| configuration | greedy identical | target forwards old / new | seeded sample identical | auto budget |")
    print("|---|---|---|---|---|")
    for label in old:
        a, b = old[label], new.get(label, {})
        greedy = "-" if "greedy" not in a else "yes" if a["greedy"] == b.get("greedy") else "NO"
        sampled = "-" if "sampled" not in a else "yes" if a["sampled"] == b.get("sampled") else "no"
        forwards = f"{a.get('forwards', '-')} / {b.get('forwards', '-')}"
        bad += greedy == "NO"
        budget = f"{a.get('budget') or '-'} / {b.get('budget') or '-'}"
        print(f"| {label} | {greedy} | {forwards} | {sampled} | {budget} |")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write this tree's outputs here")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    parser.add_argument("--only", help="run the configurations whose label contains this")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    run(args.out, args.tokens, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
