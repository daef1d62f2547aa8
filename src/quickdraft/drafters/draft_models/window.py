"""The part of a sequence an independent draft model reads (`model:...;window=N`).

A draft only proposes; the target verifies every token over the whole sequence, so what the draft
reads changes its acceptance and its cost, never the output. A long prompt's prefill costs the draft
in proportion to its length (the Qwen2.5-Coder 0.5B: 0.74 s for 700 tokens on 2 cores, against the
1.5B target's 2.07 s), paid before the first draft. With a window of N the draft reads the prompt's
first SINK tokens (the chat template's opening, which attention leans on, as StreamingLLM keeps its
sinks) and its last N - SINK, then everything generated; positions are its own, contiguous (RoPE
reads only their differences).

A fitted window (a draft's fast form, `drafters/draft_models/fast_form.py`, where `;window=` is not given) reads
fewer prompt tokens for a short generation: at most as many as the generation may add, and at least
FIT_MIN. The draft's prefill is paid before its first draft and only the drafted tokens repay it: on
the Qwen pair a 256-token window cost about 9 target steps, what speculation saves in about 64 tokens
of prose (docs/benchmarks.md, stop 76).
"""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.errors import QuickdraftError

SINK = 4  # the prompt's opening tokens a window keeps
FIT_MIN = 64  # the fewest prompt tokens a fitted window reads


def parse_window(value: str | None, where: str) -> int | None:
    """`;window=N` -> N (None: the whole sequence); refused unless an integer > SINK."""
    if value is None:
        return None
    if not value.isdigit() or int(value) <= SINK:
        raise QuickdraftError(f"{where}: window must be an integer > {SINK} (prompt tokens the draft reads): {value!r}")
    return int(value)


def fitted_size(size: int, budget: int | None) -> int:
    """The prompt tokens a fitted window of `size` reads before a generation of at most `budget` new
    tokens (None: not known): the budget, within [FIT_MIN, size]."""
    return size if budget is None else max(min(size, budget), min(size, FIT_MIN))


def readable(context: Sequence[int], rows: int | None) -> Sequence[int]:
    """`context` as a draft with `rows` embedding rows can read it (None: all of it): a padded target's
    padding ids, which a narrower draft has no rows for, read as id 0. What a draft reads never changes
    what the target accepts, only how well it guesses."""
    if rows is None or max(context, default=0) < rows:
        return context
    return [t if t < rows else 0 for t in context]


class ContextWindow:
    """The draft's view of a growing sequence: the whole of it, or a prompt cut to `size` tokens.

    Args:
        size: prompt tokens the draft reads (None: all).
        fitted: `size` is the most; a shorter generation reads fewer (`fitted_size`).
    """

    __slots__ = ("size", "fitted", "read", "_head", "_skip")

    def __init__(self, size: int | None = None, fitted: bool = False) -> None:
        self.size, self.fitted = size, fitted
        self.read = size  # the prompt tokens the current sequence's view keeps at most
        self._head: list[int] = []
        self._skip = 0

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        """Cut a new sequence's prompt, which will grow by at most `budget` tokens (None: not known):
        its first SINK tokens, then its last read - SINK (read: `size`, or `fitted_size` when fitted)."""
        size = self.read = fitted_size(self.size, budget) if self.fitted and self.size is not None else self.size
        cut = size is not None and len(prompt_ids) > size
        self._head = list(prompt_ids[:SINK]) if cut else []
        self._skip = len(prompt_ids) - (size - SINK) if cut else 0

    def view(self, context: Sequence[int]) -> Sequence[int]:
        """What the draft reads of `context` (the prompt this sequence began with, then tokens after it)."""
        return context if not self._skip else [*self._head, *context[self._skip :]]
