"""What one bench method run on one prompt produced: the record every method (ours and the peers)
returns, written as a row of results.jsonl; and reading those rows back (`read_rows`: the file as
written, or xz-compressed as stored under docs/bench)."""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunOutput:
    """What one method run on one prompt produced (the bench row's measurements)."""

    token_ids: list[int]
    wall_s: float
    target_forwards: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # tokens per target forward (ours only)
    extra: dict[str, int] = field(default_factory=dict)  # method-specific counters (PEARL runs)
    draft_cost_units: float | None = None  # drafting in target forwards (bench/cost.py); None: not counted
    prefill_s: float | None = None  # the prompt's prefill to the first token (None: not measured apart)


def read_rows(folder: Path) -> list[dict] | None:
    """The rows of a bench run's folder: results.jsonl, else results.jsonl.xz; None when neither exists."""
    plain, packed = folder / "results.jsonl", folder / "results.jsonl.xz"
    if plain.is_file():
        text = plain.read_text()
    elif packed.is_file():
        text = lzma.decompress(packed.read_bytes()).decode()
    else:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]
