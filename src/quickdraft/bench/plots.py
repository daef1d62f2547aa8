"""Figures from results.json only (no model imports): speedup by category, acceptance by draft
position, speedup against draft length."""

from __future__ import annotations

import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_png(fig, path: Path, **kwargs) -> None:
    """Save `fig` as a 256-colour palette PNG (a third of matplotlib's RGBA size for these plots, so
    committed bench folders stay small) and close it."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, **kwargs)
    plt.close(fig)
    image = Image.open(buf).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


def plot_speedup_by_category(summary: dict, path: Path) -> None:
    methods = [m for m in summary["methods"] if m != "ar"]
    cats = sorted({c for m in methods for c in summary["methods"][m]["categories"]})
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cats) + 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        vals = [summary["methods"][m]["categories"].get(c, {}).get("speedup_vs_ar", 0.0) for c in cats]
        ax.bar([x + i * width for x in range(len(cats))], vals, width, label=m)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(cats))], cats, rotation=35, ha="right")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    fig.tight_layout()
    save_png(fig, path, bbox_inches="tight")


def plot_acceptance_by_position(summary: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, s in summary["methods"].items():
        rates = s.get("acceptance_rate_per_position") or []
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=m)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def plot_speedup_vs_draft_length(summary: dict, path: Path) -> bool:
    """One line per method family (the method string without draft_length); False if nothing varies."""
    series: dict[str, list[tuple[int, float]]] = {}
    for m, s in summary["methods"].items():
        match = re.search(r"draft_length=(\d+)", m)
        k = int(match.group(1)) if match else 4 if m.startswith(("sd", "hf-assisted")) else None
        if k is None:
            continue
        family = re.sub(r",?draft_length=\d+", "", m).rstrip(":")
        series.setdefault(family, []).append((k, s["speedup_vs_ar"]))
    if not any(len(v) > 1 for v in series.values()):
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for family, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=family)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel("draft length (gamma)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    return True
