"""Delivering a generation to its client: one JSON response, or an SSE stream; either way a client
that goes away cancels the generation, and its worker slot is released only once the generation has
really stopped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request

from quickdraft.server.admission import Admitted
from quickdraft.server.metrics import Metrics
from quickdraft.server.protocol import APIError, chunk, final_chunk
from quickdraft.server.worker import DoneEvent, ErrorEvent, TokenEvent, Worker
from quickdraft.types import GenerationResult


class DisconnectWatch:
    """Hands out a request's worker events; every 0.2 s (also while tokens keep arriving) it checks
    whether the client went away, and then cancels the generation and returns None."""

    def __init__(self, request: Request, job: Admitted) -> None:
        self.request, self.events, self.cancel = request, job.events, job.cancel
        self.next_check = asyncio.get_running_loop().time() + 0.2

    async def next(self):
        loop = asyncio.get_running_loop()
        while True:
            timeout = self.next_check - loop.time()
            if timeout > 0:
                try:
                    return await asyncio.wait_for(self.events.get(), timeout=timeout)
                except asyncio.TimeoutError:
                    pass
            self.next_check = loop.time() + 0.2
            if await self.request.is_disconnected():
                self.cancel.set()
                return None


async def drain(events: asyncio.Queue) -> None:
    """Wait (off the request path) until a cancelled generation has really stopped."""
    while True:
        event = await events.get()
        if isinstance(event, (DoneEvent, ErrorEvent)):
            return


async def drain_then_release(events: asyncio.Queue, worker: Worker) -> None:
    try:
        await drain(events)
    finally:
        worker.release()


async def wait_result(request: Request, job: Admitted, worker: Worker) -> GenerationResult | None:
    """The finished generation, or None when the client went away (it was cancelled). The worker
    slot is released either way."""
    watch = DisconnectWatch(request, job)
    try:
        while True:
            event = await watch.next()
            if event is None:
                await drain(job.events)
                return None
            if isinstance(event, DoneEvent):
                return event.result
            if isinstance(event, ErrorEvent):
                raise event.error
    finally:
        worker.release()


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def sse(
    request: Request, job: Admitted, rid: str, name: str, worker: Worker, metrics: Metrics
) -> AsyncIterator[str]:
    """The OpenAI SSE stream of a generation: text deltas, the finish chunk, usage when asked, then
    [DONE]; an internal failure after the stream started is sent in-band. A stream that ends early
    (client gone) cancels the generation and releases its slot once it has stopped."""
    req, sent, finished = job.req, "", False
    watch = DisconnectWatch(request, job)
    try:
        if req.kind == "chat":
            yield _data(chunk(req, rid, name, role=True))
        while True:
            event = await watch.next()
            if event is None:
                return
            if isinstance(event, TokenEvent):
                if event.text.startswith(sent) and len(event.text) > len(sent):
                    yield _data(chunk(req, rid, name, text=event.text[len(sent) :]))
                    sent = event.text
            elif isinstance(event, DoneEvent):
                result = event.result
                if result.text.startswith(sent) and len(result.text) > len(sent):
                    yield _data(chunk(req, rid, name, text=result.text[len(sent) :]))
                yield _data(chunk(req, rid, name, finish=result.finish_reason))
                if req.include_usage or req.return_spec_stats:
                    yield _data(final_chunk(req, rid, name, result, len(job.ids)))
                metrics.observe(result)
                finished = True
                yield "data: [DONE]\n\n"
                return
            else:  # an internal failure after the stream started: in-band error, then [DONE]
                err = APIError(500, f"generation failed: {event.error}")
                finished = True
                yield _data(err.body())
                yield "data: [DONE]\n\n"
                return
    finally:
        if not finished:
            job.cancel.set()
            asyncio.ensure_future(drain_then_release(job.events, worker))
        else:
            worker.release()
