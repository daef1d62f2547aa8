"""One generation at a time on one worker thread, behind a bounded queue.

The model and its caches are not thread-safe, so a single thread runs every generation in FIFO
order; at most `max_queue` requests wait behind the running one and the rest are refused (429).
Each request gets a cancel flag, checked after every draft/verify round.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.engine import Engine
from quickdraft.types import GenerationResult


@dataclass
class TokenEvent:
    """Text made visible by one new token (may be empty while a stop string could still cut it)."""

    text: str


@dataclass
class DoneEvent:
    result: GenerationResult


@dataclass
class ErrorEvent:
    error: BaseException


class Worker:
    def __init__(self, max_queue: int = 8) -> None:
        self.max_queue = max_queue
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quickdraft-gen")
        self._lock = threading.Lock()
        self.pending = 0  # running + waiting

    capacity = 1  # generations running at once

    def prepare(self, engine: Engine) -> None:
        """Called once the engine is loaded (a batching worker builds its decoder here)."""

    @property
    def running(self) -> int:
        return min(self.pending, 1)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def try_admit(self) -> bool:
        with self._lock:
            if self.pending >= self.max_queue + 1:
                return False
            self.pending += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.pending -= 1

    def run(
        self, engine: Engine, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig, cancel: threading.Event
    ) -> asyncio.Queue:
        """Start a generation; events arrive on the returned queue: TokenEvent*, then DoneEvent or
        ErrorEvent. Setting `cancel` stops the generation after the current round."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def put(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def work() -> None:
            try:
                collector = None
                stream = engine.stream_ids(prompt_ids, sampling, stop)
                try:
                    for kept, collector in stream:
                        if cancel.is_set():
                            break
                        first = len(collector.tokens) - len(kept)
                        for j in range(1, len(kept) + 1):  # one event per token, in order
                            put(TokenEvent(collector.text(first + j)))
                finally:
                    stream.close()
                if collector is not None:
                    put(DoneEvent(collector.result()))
            except BaseException as exc:  # reported to the request, never kills the worker
                put(ErrorEvent(exc))

        if cancel.is_set():
            raise RuntimeError("cancelled before start")
        self.executor.submit(work)
        return events
