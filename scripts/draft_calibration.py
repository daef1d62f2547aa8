"""Is a draft model's top-1 probability the chance a greedy verify accepts its token? Teacher-forced over
a bench run's plain-decoding outputs (its `ar` rows, which keep their prompt ids):

    python scripts/draft_calibration.py docs/bench/defaults-pair-quick-curve-avx512 \
        docs/bench/defaults-pair-he24-curve-avx512 --target qwen2.5-coder-1.5b

The engine's drafter (the target's default, or --drafter `model:...`/`mix:model:...`) reads each prompt
through its window, then the target's own tokens one by one; at every position its top-1 id and top-1
probability p are kept, and the token counts as accepted when that id is the target's. `CostStop` (the
p-min chain, decoding/adaptive.py) prices a chain on p as that chance. Prints, per group of categories
(code: coding, math, math_reasoning, reasoning; prose: the rest), the mean p and the accepted share in
bins of p, and writes the same tables as JSON to --out (default calibration.json).
"""

from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path

import torch

from quickdraft.engine import Engine
from quickdraft.settings.options import options_from

CODE = {"coding", "math", "math_reasoning", "reasoning"}
BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.01)


def ar_rows(folder: Path) -> list[dict]:
    """The `ar` rows of a bench folder's results.jsonl(.xz) that kept their prompt ids."""
    path = folder / "results.jsonl"
    opened = open(path) if path.exists() else lzma.open(folder / "results.jsonl.xz", "rt")  # noqa: SIM115
    with opened as fh:
        rows = [json.loads(line) for line in fh]
    return [r for r in rows if r["method"] == "ar" and "prompt_ids" in r]


@torch.inference_mode()
def scored(drafter, row: dict) -> list[tuple[float, bool]]:
    """(top-1 p, accepted) at each of the row's generated positions, the draft teacher-forced."""
    drafter.begin(row["prompt_ids"], len(row["token_ids"]))
    view = drafter.window.view(row["prompt_ids"])
    first = drafter.model.sync(view)[-1:]  # (1, V): the prediction of the first new token
    rest = drafter.model.extend(row["token_ids"][:-1], last_only=False) if len(row["token_ids"]) > 1 else first[:0]
    probs = torch.softmax(torch.cat([first, rest]).float(), -1)
    p, top = probs.max(-1)
    return [(float(pi), int(ti) == t) for pi, ti, t in zip(p, top, row["token_ids"], strict=True)]


def table(points: list[tuple[float, bool]]) -> list[dict]:
    """Per bin of p: how many positions, their mean p, the share accepted."""
    out = []
    for lo, hi in zip(BINS, BINS[1:], strict=False):
        inside = [(p, a) for p, a in points if lo <= p < hi]
        if inside:
            mean_p = sum(p for p, _ in inside) / len(inside)
            out.append(
                {
                    "bin": [lo, min(hi, 1.0)],
                    "n": len(inside),
                    "mean_p": mean_p,
                    "accepted": sum(a for _, a in inside) / len(inside),
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="bench output folders with `ar` rows")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("calibration.json"))
    args = parser.parse_args()
    options = {"target": args.target, "method": "sd", "drafter": args.drafter, "threads": args.threads}
    engine = Engine.load(config=options_from(options))
    drafter = getattr(engine.drafter, "model", engine.drafter)  # a mixed drafter's model stage
    groups: dict[str, list[tuple[float, bool]]] = {"code": [], "prose": []}
    for folder in args.folders:
        for row in ar_rows(folder):
            groups["code" if row["category"] in CODE else "prose"] += scored(drafter, row)
    report = {name: table(points) for name, points in groups.items() if points}
    for name, bins in report.items():
        points = groups[name]
        print(
            f"{name}: {len(points)} positions, mean p {sum(p for p, _ in points) / len(points):.3f}, "
            f"accepted {sum(a for _, a in points) / len(points):.3f}"
        )
        for b in bins:
            lo, hi = b["bin"]
            print(f"  p in [{lo:.2f}, {hi:.2f}): n {b['n']:4d}, mean p {b['mean_p']:.2f}, accepted {b['accepted']:.2f}")
    args.out.write_text(json.dumps({"drafter": engine.config.drafter, "groups": report}, indent=1))


if __name__ == "__main__":
    main()
