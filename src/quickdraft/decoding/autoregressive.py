"""Plain autoregressive decoding: the baseline of every benchmark and the oracle of every test."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from quickdraft.config import SamplingConfig
from quickdraft.decoding.common import Generators, pick_token, prefill_step
from quickdraft.runtime.target import Target
from quickdraft.types import Round


class Autoregressive:
    """One target forward per token (method name "ar")."""

    name = "ar"
    lossy = False
    verifier = None  # nothing to verify

    def __init__(self, target: Target, events: dict[str, int] | None = None) -> None:
        self.target = target
        self.events = dict(events or {})  # reported once, with the first token (why no speculation ran)

    def rounds(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, max_new_tokens: int, generators: Generators
    ) -> Iterator[Round]:
        """Yield one Round per token until the consumer stops (EOS, stop string or budget)."""
        first = prefill_step(self.target, prompt_ids, sampling, generators)
        first.events = dict(self.events)
        yield first
        token, position = first.tokens[0], len(prompt_ids)
        while True:
            start = time.perf_counter()
            logits = self.target.extend([token], last_only=True)[-1]
            position += 1
            token = pick_token(logits, sampling, generators, position)
            yield Round(tokens=[token], verify_s=time.perf_counter() - start)
