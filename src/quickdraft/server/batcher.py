"""Continuous batching for the server: every running request shares each target forward.

One thread owns the engine's `BatchDecoder` (decoding/batch.py): requests join the running batch at
round boundaries, each with its own sampling settings, seed, stop strings and token budget; each
round's new tokens go to their requests' event queues (the same events as `Worker`'s, so admission
and streaming do not change); a request whose client went away (its cancel flag) leaves the batch
at the next round boundary. At most `max_batch` run and `max_queue` wait; more get 429.

Every drafter kind but CS Drafting's cascade batches (each row drafts with its own fork). An engine
that cannot batch (`Engine.batch_unsupported`: PEARL, csd, a lossy verifier, a target on the `hf`
runtime) is served one request at a time by the `Worker` underneath, and says so at start-up.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from dataclasses import dataclass

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.engine import Engine
from quickdraft.server.worker import DoneEvent, ErrorEvent, TokenEvent, Worker
from quickdraft.types import GenerationResult, SpecStats


@dataclass
class _Job:
    ids: list[int]
    sampling: SamplingConfig
    stop: StopConfig
    cancel: threading.Event
    put: object  # event -> None, thread-safe into the request's asyncio queue


class Batcher(Worker):
    """A Worker whose generations run together (module docstring).

    Args:
        max_queue: requests allowed to wait beyond the running batch (create_app sizes it: admission.queue_size).
        max_batch: the most requests decoded together (None: fitted to the host by the engine).
    """

    def __init__(self, max_queue: int = 8, max_batch: int | None = None) -> None:
        super().__init__(max_queue)
        self.max_batch, self.capacity = max_batch, 1
        self.decoder = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopped = False
        self._jobs: dict[int, _Job] = {}
        self._next_key = 0

    def prepare(self, engine: Engine) -> None:
        """Build the batch decoder once the engine is loaded (else serve one request at a time)."""
        reason = engine.batch_unsupported()
        if reason is not None:
            print(f"quickdraft serve: one request at a time ({reason})", file=sys.stderr)
            return
        self.decoder = engine.batch_decoder(self.max_batch)
        self.capacity = self.decoder.target.max_batch
        print(f"quickdraft serve: continuous batching, up to {self.capacity} requests at once", file=sys.stderr)
        threading.Thread(target=self._loop, daemon=True, name="quickdraft-batch").start()

    @property
    def running(self) -> int:
        return len(self.decoder.rows) if self.decoder is not None else min(self.pending, 1)

    def try_admit(self) -> bool:
        with self._lock:
            if self.pending >= self.max_queue + self.capacity:
                return False
            self.pending += 1
            return True

    def run(
        self, engine: Engine, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig, cancel: threading.Event
    ) -> asyncio.Queue:
        if self.decoder is None:
            return super().run(engine, prompt_ids, sampling, stop, cancel)
        if cancel.is_set():
            raise RuntimeError("cancelled before start")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        self._inbox.put(
            _Job(prompt_ids, sampling, stop, cancel, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        )
        self._wake.set()
        return events

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        decoder = self.decoder
        while not self._stopped:
            while not self._inbox.empty():
                job = self._inbox.get()
                key, self._next_key = self._next_key, self._next_key + 1
                try:
                    decoder.submit(key, job.ids, job.sampling, job.stop)
                except ValueError as exc:  # admission checks first; this one request fails, not the thread
                    job.put(ErrorEvent(exc))
                    continue
                self._jobs[key] = job
            for key, job in list(self._jobs.items()):
                if job.cancel.is_set():
                    decoder.cancel(key)
                    del self._jobs[key]
                    job.put(DoneEvent(GenerationResult("", [], "abort", SpecStats())))
            if decoder.idle:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                updates = decoder.step()
            except Exception as exc:  # a failed round fails every request in the batch, never the thread
                decoder.abort()
                for job in self._jobs.values():
                    job.put(ErrorEvent(exc))
                self._jobs.clear()
                continue
            for update in updates:
                job, collector = self._jobs.get(update.key), update.collector
                if job is None:
                    continue
                first = len(collector.tokens) - len(update.tokens)
                for j in range(1, len(update.tokens) + 1):
                    job.put(TokenEvent(collector.text(first + j)))
                if collector.done:
                    del self._jobs[update.key]
                    job.put(DoneEvent(collector.result()))
