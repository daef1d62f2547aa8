"""Plot train-draft's per-step greedy agreement (a moving average) from a run's report.json.

python scripts/plot_train_heads.py docs/bench/train-heads/report.json docs/bench/train-heads/agreement.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(report: str, out: str, window: int = 50) -> None:
    history = json.load(open(report))["history"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in ("head", "kangaroo", "specdec"):
        points = [(h["step"], h[f"{kind}_agree"]) for h in history if f"{kind}_agree" in h]
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        ax.plot(steps, smooth, label=kind)
    ax.set_xlabel("step (8 corpus rows each)")
    ax.set_ylabel(f"greedy agreement on training batches ({window}-step mean)")
    ax.set_title("train-draft on the SeqKD corpus (2 CPU cores, bf16 target)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
