"""Plot expected acceptance (sum min(p, q) on the training batch) per step for distillation runs.

Usage: python scripts/plot_distill_history.py RUN_OR_HISTORY... --out plot.png
Each line is a moving average over 10 steps, split by data source (fixed / target / draft).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=int, default=10)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in args.runs:
        path = Path(run) / "history.jsonl" if Path(run).is_dir() else Path(run)
        rows = {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}  # a resume may repeat steps
        for source in ("fixed", "target", "draft"):
            pts = [(s, r["expected_acceptance"]) for s, r in sorted(rows.items()) if r["source"] == source]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            smooth = [
                sum(ys[max(0, i - args.window + 1) : i + 1]) / len(ys[max(0, i - args.window + 1) : i + 1])
                for i in range(len(ys))
            ]
            ax.plot(xs, smooth, label=f"{path.parent.name if path.name == 'history.jsonl' else path.stem}: {source}")
    ax.set_xlabel("step")
    ax.set_ylabel("expected acceptance on the training batch")
    ax.set_title("DistillSpec training (moving average)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
