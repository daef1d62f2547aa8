"""The part of a sequence an independent draft model reads (`model:...;window=N`).

A draft only proposes; the target verifies every token over the whole sequence, so what the draft
reads changes its acceptance and its cost, never the output. A long prompt's prefill costs the draft
in proportion to its length (the Qwen2.5-Coder 0.5B: 0.74 s for 700 tokens on 2 cores, against the
1.5B target's 2.07 s), paid before the first draft. With a window of N the draft reads the prompt's
first SINK tokens (the chat template's opening, which attention leans on, as StreamingLLM keeps its
sinks) and its last N - SINK, then everything generated; positions are its own, contiguous (RoPE
reads only their differences).
"""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.errors import QuickdraftError

SINK = 4  # the prompt's opening tokens a window keeps


def parse_window(value: str | None, where: str) -> int | None:
    """`;window=N` -> N (None: the whole sequence); refused unless an integer > SINK."""
    if value is None:
        return None
    if not value.isdigit() or int(value) <= SINK:
        raise QuickdraftError(f"{where}: window must be an integer > {SINK} (prompt tokens the draft reads): {value!r}")
    return int(value)


class ContextWindow:
    """The draft's view of a growing sequence: the whole of it, or a prompt cut to `size` tokens.

    Args:
        size: prompt tokens the draft reads (None: all).
    """

    __slots__ = ("size", "_head", "_skip")

    def __init__(self, size: int | None = None) -> None:
        self.size = size
        self._head: list[int] = []
        self._skip = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Cut a new sequence's prompt: its first SINK tokens, then its last size - SINK."""
        cut = self.size is not None and len(prompt_ids) > self.size
        self._head = list(prompt_ids[:SINK]) if cut else []
        self._skip = len(prompt_ids) - (self.size - SINK) if cut else 0

    def view(self, context: Sequence[int]) -> Sequence[int]:
        """What the draft reads of `context` (the prompt this sequence began with, then tokens after it)."""
        return context if not self._skip else [*self._head, *context[self._skip :]]
