"""What one bench method run on one prompt produced: the record every method (ours and the peers)
returns, written as a row of results.jsonl."""

from __future__ import annotations

from dataclasses import dataclass, field


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
