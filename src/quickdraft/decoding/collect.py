"""Turn a stream of Rounds into a GenerationResult, applying EOS, stop strings and the token budget
exactly: nothing after the end is emitted or counted, and the loop is closed at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from quickdraft.config import StopConfig
from quickdraft.types import GenerationResult, Round, SpecStats

Detokenize = Callable[[list[int]], str]


def _record(stats: SpecStats, rnd: Round, kept: int, index: int) -> None:
    stats.num_target_forwards += 1
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
    while len(stats.drafted_per_position) < k:
        stats.drafted_per_position.append(0)
        stats.accepted_per_position.append(0)
    for i in range(k):
        stats.drafted_per_position[i] += 1
        stats.accepted_per_position[i] += int(i < accepted)


def collect(
    rounds: Iterator[Round], stop: StopConfig, detokenize: Detokenize | None = None, lossy: bool = False
) -> GenerationResult:
    """Consume `rounds` until EOS, a stop string or max_new_tokens.

    Args:
        rounds: a decode loop's generator (closed here when the generation ends).
        stop: the end conditions.
        detokenize: ids -> text (special tokens skipped); needed for stop strings and the text.
        lossy: whether the verifier was lossy (recorded in the statistics).
    """
    stats = SpecStats(lossy=lossy)
    tokens: list[int] = []
    finish, text = "length", None
    eos = set(stop.eos_token_ids)
    start = time.perf_counter()
    try:
        for index, rnd in enumerate(rounds):
            kept, done = 0, False
            for token in rnd.tokens:
                tokens.append(token)
                kept += 1
                if token in eos:
                    finish, done = "stop", True
                elif stop.stop_strings and detokenize is not None:
                    decoded = detokenize(tokens)
                    cut = min((i for s in stop.stop_strings if (i := decoded.find(s)) >= 0), default=-1)
                    if cut >= 0:
                        finish, done, text = "stop", True, decoded[:cut]
                if not done and len(tokens) >= stop.max_new_tokens:
                    finish, done = "length", True
                if done:
                    break
            _record(stats, rnd, kept, index)
            if done:
                break
    finally:
        rounds.close()
    stats.wall_s = time.perf_counter() - start
    stats.num_new_tokens = len(tokens)
    if text is None:
        text = detokenize(tokens) if detokenize is not None else ""
    return GenerationResult(text=text, token_ids=tokens, finish_reason=finish, stats=stats)
