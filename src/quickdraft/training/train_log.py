"""What a long training run leaves to look at: held-out evaluations as JSON lines, and their plot.

`OUTPUT/eval.jsonl` gets one line per module per evaluation (every `--eval-every` steps, and at the
start and end): the step, the scored positions seen so far, the teacher-forced greedy agreement on the
held-out greedy and sampled rows, and the tokens per target forward of greedy speculative decoding
on held-out prompts. `OUTPUT/eval.png` plots agreement and tokens per forward against positions seen.
"""

from __future__ import annotations

import json
from pathlib import Path


def truncate_history(path: Path, step: int) -> None:
    """Drop a `history.jsonl`'s rows of steps after `step` (a run stopped between two checkpoints)."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    keep = [x for x in lines if x.strip() and json.loads(x)["step"] <= step]
    if len(keep) != len(lines):
        path.write_text("".join(x + "\n" for x in keep))


def append_eval(path: Path, row: dict) -> None:
    """Add one evaluation line (the file is created on first use)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_evals(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_evals(rows: list[dict], png: Path, title: str = "train-draft") -> Path | None:
    """Two panels against scored positions seen: held-out greedy agreement (greedy and sampled rows,
    each unrolled step), and tokens per target forward; one line per module. None without rows."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["positions_seen"])
        x = [r["positions_seen"] / 1e6 for r in mine]
        for mode, style in (("greedy", "-"), ("sample", "--")):
            keys = sorted(k for k in mine[-1].get(mode, {}) if k.startswith("greedy_agreement"))
            for key in keys:
                step = key.removeprefix("greedy_agreement").lstrip("_") or "1"
                y = [r.get(mode, {}).get(key) for r in mine]
                left.plot(x, y, style, marker=".", label=f"{kind} {mode} rows, step {step}")
        y = [r.get("decode", {}).get("tokens_per_target_forward") for r in mine]
        right.plot(x, y, marker=".", label=kind)
    left.set(xlabel="scored positions seen (M)", ylabel="held-out greedy agreement", title="teacher-forced")
    right.set(xlabel="scored positions seen (M)", ylabel="tokens per target forward", title="greedy decoding")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
