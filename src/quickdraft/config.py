"""Frozen, validated configuration values shared across layers (no I/O here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quickdraft.errors import QuickdraftError

DTYPES = ("bfloat16", "float32", "float64")


@dataclass(frozen=True)
class SamplingConfig:
    """How one distribution over the vocabulary is turned into a token.

    The same processing (temperature, then top-k, then top-p) is applied to the target's p and the
    draft's q, so speculative sampling is lossless with respect to the processed target law.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_k: keep the k most likely tokens (0 = off).
        top_p: keep the smallest set whose probability reaches top_p (1.0 = off).
        seed: per-request seed; None draws a fresh one.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise QuickdraftError(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise QuickdraftError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise QuickdraftError(f"top_p must be in (0, 1], got {p!r}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63):
            raise QuickdraftError(f"seed must be a 64-bit integer, got {seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class StopConfig:
    """When a generation ends. The terminating EOS is emitted and counted (plain greedy's rule).

    Attributes:
        max_new_tokens: hard budget of generated tokens (>= 1).
        eos_token_ids: token ids that end the generation.
        stop_strings: strings that end the generation; the text is cut before them.
    """

    max_new_tokens: int = 128
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise QuickdraftError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop_strings):
            raise QuickdraftError("stop strings must be non-empty strings")


SCHEDULES = ("fixed", "heuristic", "confidence", "cost")


@dataclass(frozen=True)
class DraftConfig:
    """How many tokens to draft per round.

    Attributes:
        num_draft_tokens: gamma, the (initial, for adaptive schedules) draft length (>= 1).
        schedule: "fixed", "heuristic" (transformers' +2 on full acceptance / -1 otherwise),
            "confidence" (stop drafting once the draft's top-1 probability falls below threshold) or
            "cost" (draft on while one more token is expected to pay on this host's measured costs).
        confidence_threshold: the threshold of the "confidence" schedule, in (0, 1).
        max_num_draft_tokens: upper bound for the heuristic schedule (default max(16, gamma)).
        tree: node budget of a draft tree (0 = a chain of num_draft_tokens; None = auto: a budget
            sized from this host's measured verify costs for drafters with a gain table (suffix, a
            trained head), a chain for the others; `options_from` makes it 0 when a draft length or
            schedule is given without it).
        tree_width: dynamic trees: nodes expanded per depth and children per expanded node.
        tree_shape: "dynamic" (EAGLE-2: by cumulative draft probability) or static children per
            node by depth, e.g. "3,2,1" (or "3:2:1", which a bench method string can hold).
        guard: drop to plain rounds while drafting measurably loses on this host's costs, and probe
            again later (`decoding/guard.py`), for chains and trees alike; False drafts every round.
        siblings: a greedy chain priced by the "cost" schedule offers a model draft's second choice
            beside a position where it is expected to pay (`adaptive.CostStop.sibling`; a lone request on a
            target that verifies trees); False: plain chains.
    """

    num_draft_tokens: int = 4
    schedule: str = "fixed"
    confidence_threshold: float = 0.4
    max_num_draft_tokens: int | None = None
    tree: int | None = None
    tree_width: int = 8
    tree_shape: str = "dynamic"
    guard: bool = True
    siblings: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.num_draft_tokens, int) or self.num_draft_tokens < 1:
            raise QuickdraftError(f"draft length must be an integer >= 1, got {self.num_draft_tokens!r}")
        if self.max_num_draft_tokens is None:  # frozen: set the derived default once
            object.__setattr__(self, "max_num_draft_tokens", max(16, self.num_draft_tokens))
        if self.schedule not in SCHEDULES:
            raise QuickdraftError(f"unknown draft schedule {self.schedule!r}; choose {', '.join(SCHEDULES)}")
        if not (0.0 < self.confidence_threshold < 1.0):
            raise QuickdraftError(f"confidence threshold must be in (0, 1), got {self.confidence_threshold}")
        if self.max_num_draft_tokens < self.num_draft_tokens:
            raise QuickdraftError("max_num_draft_tokens must be >= num_draft_tokens")
        if (
            (self.tree is not None and (not isinstance(self.tree, int) or self.tree < 0))
            or not isinstance(self.tree_width, int)
            or self.tree_width < 1
        ):
            raise QuickdraftError(f"draft tree budget must be >= 0 and width >= 1, got {self.tree}, {self.tree_width}")
        _ = self.tree_widths  # validates the shape

    @property
    def tree_widths(self) -> tuple[int, ...] | None:
        """Static per-depth children counts, or None for the dynamic shape."""
        if self.tree_shape == "dynamic":
            return None
        try:
            widths = tuple(int(w) for w in self.tree_shape.replace(":", ",").split(","))
        except ValueError:
            widths = ()
        if not widths or min(widths) < 1:
            raise QuickdraftError(
                f"tree shape must be dynamic or children per depth like 3,2,1, got {self.tree_shape!r}"
            )
        return widths
