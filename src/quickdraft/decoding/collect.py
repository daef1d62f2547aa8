"""Apply EOS, stop strings and the token budget to a stream of Rounds, exactly: nothing after the end
is emitted or counted. `Collector` works round by round (streaming); `collect` drives it to the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from quickdraft.config import StopConfig
from quickdraft.prompts import IncrementalDetokenizer
from quickdraft.types import GenerationResult, Round, SpecStats

Detokenize = Callable[[list[int]], str]
Held = Callable[[], int]


def _record(stats: SpecStats, rnd: Round, kept: int, index: int) -> None:
    stats.num_target_forwards += 1
    stats.accepted_lengths.append(kept)
    for key, value in rnd.events.items():
        stats.extra[key] = stats.extra.get(key, 0) + value
    if index == 0:
        stats.prefill_s += rnd.verify_s
    else:
        stats.draft_s += rnd.draft_s
        stats.verify_s += rnd.verify_s
    if rnd.num_draft_tokens == 0:
        return
    # When the generation ends on an accepted draft, the draft positions after it are neither
    # emitted nor counted (as drafted or accepted).
    ended_in_drafts = kept <= rnd.num_accepted
    k = kept if ended_in_drafts else rnd.num_draft_tokens
    accepted = kept if ended_in_drafts else rnd.num_accepted
    stats.num_drafts += 1
    stats.num_draft_tokens += k
    stats.num_accepted_draft_tokens += accepted
    if rnd.draft_depth is not None:  # a tree: per position = per depth (one path per depth)
        k = min(k, rnd.draft_depth)
    while len(stats.drafted_per_position) < k:
        stats.drafted_per_position.append(0)
        stats.accepted_per_position.append(0)
    for i in range(k):
        stats.drafted_per_position[i] += 1
        stats.accepted_per_position[i] += int(i < accepted)


class Collector:
    """Accumulates one generation's tokens and statistics, round by round.

    Args:
        stop: the end conditions.
        detokenize: ids -> text (special tokens skipped); needed for stop strings and text.
        lossy: whether the verifier was lossy (recorded in the statistics).
    """

    def __init__(
        self, stop: StopConfig, detokenize: Detokenize | None = None, lossy: bool = False, held: Held | None = None
    ) -> None:
        self.stop = stop
        self.held = held  # () -> the KV cache bytes the generation holds now (target + draft), read each round
        self.stats = SpecStats(lossy=lossy)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None  # set once done
        self._cut_text: str | None = None
        self._rounds = 0
        self._start = time.perf_counter()
        self._detok = IncrementalDetokenizer(detokenize) if detokenize is not None else None
        self._text_lengths: list[int] = []  # complete-character text length after each token
        self._longest_stop = max(map(len, stop.stop_strings), default=0)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def _check(self, token: int) -> None:
        text, before = "", 0
        if self._detok is not None:
            before = self._text_lengths[-1] if self._text_lengths else 0
            text = self._detok.add([token])
            self._text_lengths.append(len(text.rstrip("\ufffd")))
        if token in self.stop.eos_token_ids:
            self.finish_reason = "stop"
        elif self.stop.stop_strings and self._detok is not None:
            start = max(0, before - self._longest_stop)  # only where a stop string can newly end
            hits = [i for s in self.stop.stop_strings if (i := text.find(s, start)) >= 0]
            if hits:
                self.finish_reason, self._cut_text = "stop", text[: min(hits)]
        if not self.done and len(self.tokens) >= self.stop.max_new_tokens:
            self.finish_reason = "length"

    def feed(self, rnd: Round) -> list[int]:
        """Take one round; returns the tokens it adds (all of them unless the generation ends inside)."""
        kept: list[int] = []
        for token in rnd.tokens:
            if self.done:
                break
            self.tokens.append(token)
            kept.append(token)
            self._check(token)
        _record(self.stats, rnd, len(kept), self._rounds)
        if self.held is not None:
            self.stats.kv_cache_bytes = max(self.stats.kv_cache_bytes, self.held())
        self._rounds += 1
        return kept

    def text(self, upto: int | None = None) -> str:
        """The final text; or, while running (or for the first `upto` tokens), the text so far minus
        what a stop string could still cut (vLLM's hold-back) and an incomplete multi-byte character."""
        if self._detok is None:
            return ""
        n = len(self.tokens) if upto is None else upto
        final = self.done and n == len(self.tokens)
        if final and self._cut_text is not None:
            return self._cut_text
        if final:
            return self._detok.text
        text = self._detok.text[: self._text_lengths[n - 1]] if n else ""
        hold = max(self._longest_stop - 1, 0)
        return text[: len(text) - hold] if hold else text

    def result(self) -> GenerationResult:
        self.stats.wall_s = time.perf_counter() - self._start
        self.stats.num_new_tokens = len(self.tokens)
        return GenerationResult(self.text(), list(self.tokens), self.finish_reason or "abort", self.stats)


def run_to_end(rounds: Iterator[Round], collector: Collector) -> GenerationResult:
    """Feed `rounds` to `collector` until the generation ends; the loop is closed at once."""
    try:
        for rnd in rounds:
            collector.feed(rnd)
            if collector.done:
                break
    finally:
        rounds.close()
    return collector.result()


def collect(
    rounds: Iterator[Round], stop: StopConfig, detokenize: Detokenize | None = None, lossy: bool = False
) -> GenerationResult:
    """Consume `rounds` until EOS, a stop string or max_new_tokens."""
    return run_to_end(rounds, Collector(stop, detokenize, lossy))
