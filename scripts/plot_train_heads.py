"""Plot train-draft's per-step greedy agreement (a moving average) from a run's report.json, against
the scored positions seen (comparable across batch sizes and devices).

python scripts/plot_train_heads.py docs/bench/train-heads/report.json docs/bench/train-heads/agreement.png ["title"]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from quickdraft.bench.plots import save_png  # noqa: E402


def main(report: str, out: str, title: str = "train-draft on the SeqKD corpus", window: int = 50) -> None:
    history = json.load(open(report))["history"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in ("head", "kangaroo", "specdec"):
        for depth, style in (("", "-"), ("2", "--")):
            key = f"{kind}_agree{depth}"
            points = [(h.get("positions", h["step"]) / 1e6, h[key]) for h in history if key in h]
            if not points:
                continue
            xs, values = zip(*points, strict=True)
            smooth = [sum(values[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(values))]
            ax.plot(xs, smooth, style, label=f"{kind}, step {depth or 1}")
    ax.set_xlabel("scored positions seen (M)" if "positions" in history[0] else "step")
    ax.set_ylabel(f"greedy agreement on training batches ({window}-step mean)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, Path(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
