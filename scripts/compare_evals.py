"""Bar chart of held-out agreement by drafted position for several train-draft runs (their eval.jsonl):
the start (the first line of the first run) and each run's last evaluation.

    python scripts/compare_evals.py docs/bench/ttt/one-step docs/bench/ttt/ttt3 --out docs/bench/ttt/compare.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _last(folder: Path, first: bool = False) -> dict:
    rows = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines() if x.strip()]
    return rows[0] if first else rows[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    bars = {"start": _last(args.runs[0], first=True)} | {run.name: _last(run) for run in args.runs}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, mode in zip(axes, ("greedy", "sample"), strict=True):
        keys = sorted(k for k in bars["start"][mode] if k.startswith("greedy_agreement"))
        width = 0.8 / len(bars)
        for i, (name, row) in enumerate(bars.items()):
            ys = [row[mode].get(k, 0.0) for k in keys]
            xs = [j + i * width for j in range(len(keys))]
            ax.bar(xs, ys, width, label=f"{name} ({row['positions_seen'] / 1e3:.0f}k positions)")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [f"token {j + 1}" for j in range(len(keys))])
        ax.set(title=f"held-out {mode} rows", ylabel="teacher-forced greedy agreement")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
