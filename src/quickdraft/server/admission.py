"""Admission: what a request must pass before it takes a worker slot. The engine must be loaded
(503 otherwise), the body JSON within its size (415, 413, 400), the request valid and for this model
(400, 404), the prompt within the context (400); then a queue slot (429 when full), and the
generation starts."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from quickdraft.engine import Engine
from quickdraft.errors import ContextLengthError, QuickdraftError
from quickdraft.host import available_memory
from quickdraft.server.protocol import APIError, CompletionRequest, parse_request
from quickdraft.server.worker import Worker

MAX_BODY_BYTES = 4 * 1024 * 1024  # default request size limit (413 above it)
QUEUE_CAP = 4096  # the most waiting requests a memory-sized queue holds
TOKEN_BYTES = 36  # a prompt id held in a Python list (an int object and its pointer)
MAX_CONTEXT = 131072  # the most prompt ids a waiting request can hold (no model here has a longer context)


def queue_size(given: int | None, max_body_bytes: int, available: int | None = None) -> int:
    """The requests allowed to wait beyond the running batch: `given` when set, else sized by memory. A
    waiting request holds its body (at most `max_body_bytes`) and its prompt ids, no KV cache (rows take
    theirs when they join the batch), so half of this host's free memory over that bound, at least 8
    (the old fixed default) and at most QUEUE_CAP."""
    if given is not None:
        return given
    free = available_memory() if available is None else available
    if free is None:
        return 8
    return max(8, min(QUEUE_CAP, free // 2 // (max_body_bytes + TOKEN_BYTES * MAX_CONTEXT)))


@dataclass
class Admitted:
    """A request that got a worker slot: its parsed form, prompt ids and the generation's events."""

    req: CompletionRequest
    ids: list[int]
    events: object  # asyncio.Queue of worker events
    cancel: threading.Event


class Admission:
    """The engine (loaded in the background), the worker's queue, and the checks in front of them.

    Args:
        load_engine: builds the engine (run once, off the event loop, by `load`).
        worker: runs generations behind a bounded queue.
        model_name: the id clients send (default: the target's name once loaded).
        default_max_tokens: a request's max_tokens when it gives none.
        max_body_bytes: the request size limit.
    """

    def __init__(
        self,
        load_engine: Callable[[], Engine],
        worker: Worker,
        model_name: str | None,
        default_max_tokens: int,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_prompt_tokens: int | None = None,
        warm: bool = True,
    ) -> None:
        self.load_engine, self.worker = load_engine, worker
        self.state: dict = {"engine": None, "error": None, "name": model_name, "max_prompt_tokens": max_prompt_tokens}
        self.default_max_tokens, self.max_body_bytes, self.warm = default_max_tokens, max_body_bytes, warm

    @property
    def name(self) -> str | None:
        return self.state["name"]

    def load(self) -> None:
        """Build the engine; a failure is kept for /health."""
        try:
            engine = self.load_engine()
            rate = warm_up(engine) if self.warm else None  # before ready: the first request runs warm
            if self.state["max_prompt_tokens"] is None:  # what this host prefills in about a minute
                limit = engine.context_length if rate is None else int(rate * PREFILL_SECONDS)
                floor = min(WARM_TOKENS, engine.context_length)
                self.state["max_prompt_tokens"] = max(floor, min(engine.context_length, limit))
            self.worker.prepare(engine)
            self.state["name"] = self.state["name"] or engine.target_info.name
            self.state["engine"] = engine
        except Exception as exc:  # reported by /health
            self.state["error"] = str(exc)

    def ready_engine(self) -> Engine:
        """The loaded engine, or 503."""
        if self.state["engine"] is None:
            msg = f"model failed to load: {self.state['error']}" if self.state["error"] else "model is loading"
            raise APIError(503, msg, type_="service_unavailable")
        return self.state["engine"]

    async def read_json(self, request: Request) -> object:
        """The parsed body: 415 unless JSON, 413 above max_body_bytes (checked on Content-Length before
        reading, and again while reading for bodies without one), 400 for anything json can't parse,
        nesting too deep for the parser included."""
        limit = self.max_body_bytes
        ctype = request.headers.get("content-type", "")
        if not ctype.split(";")[0].strip().lower() == "application/json":
            raise APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit}")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        try:
            return json.loads(body)
        except RecursionError:
            raise APIError(400, "the request body is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, over-long integers
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None

    async def admit(self, request: Request, kind: str) -> Admitted | None:
        """Validate `request` and start its generation; None when the queue is full (429)."""
        return self.admit_body(await self.read_json(request), kind)

    def admit_body(self, body: object, kind: str) -> Admitted | None:
        """`admit` of a parsed JSON body."""
        req = parse_request(body, kind, self.default_max_tokens)
        engine = self.ready_engine()
        if req.model is not None and req.model != self.name:
            raise APIError(404, f"The model `{req.model}` does not exist.", "model", "NotFoundError", 404)
        try:  # the prompt's size is checked before it is tokenized (a huge text costs seconds)
            ids = _prompt_ids(engine, req)
            eos = engine.target_info.eos_token_ids
            if req.suffix is not None:  # a middle ends at the FIM family's end-of-file tokens too
                eos = engine.prompts.fim_stop_ids(eos)
            sampling, stop = req.options.sampling, req.options.stop_config(eos)
            engine.check_length(len(ids), req.options.max_new_tokens)  # before the request takes a queue slot
            limit = self.state["max_prompt_tokens"]
            if limit is not None and len(ids) > limit:
                raise APIError(
                    400,
                    f"prompt of {len(ids)} tokens exceeds this server's limit of {limit} "
                    "(--max-prompt-tokens; by default what this host prefills in about a minute)",
                    "prompt",
                    code="prompt_too_long",
                )
        except ContextLengthError as exc:
            raise APIError(400, str(exc), "max_tokens", code="context_length_exceeded") from None
        except QuickdraftError as exc:
            raise APIError(400, str(exc)) from None
        if not self.worker.try_admit():
            return None
        cancel = threading.Event()
        try:
            events = self.worker.run(engine, ids, sampling, stop, cancel)
        except BaseException:
            self.worker.release()
            raise
        return Admitted(req, ids, events, cancel)


PREFILL_SECONDS = 60  # the default prompt limit: what this host prefills in about this long
WARM_TOKENS = 256  # the warm-up prompt's length (shorter where the context is: prompt + WARM_NEW fit it)
WARM_NEW = 8  # the warm-up generation's new tokens


def warm_up(engine: Engine) -> float | None:
    """Run what a first request needs before the server says ready (kernels, the drafter's builds and
    first forwards, the host's cost curves): one greedy generation of a WARM_TOKENS-token prompt.
    Returns the prompt tokens per second its prefill took (None without a tokenizer to make one)."""
    if engine.prompts.tokenizer is None:
        return None
    new = min(WARM_NEW, max(1, engine.context_length // 4))  # a short context still warms up (and gets ready)
    text = ("def add(a, b):\n    return a + b\n\n" * WARM_TOKENS)[: engine.context_length]  # a token >= a char
    ids = engine.encode(text, raw=True)[: min(WARM_TOKENS, engine.context_length - new)]
    result = engine.generate(ids, max_new_tokens=new, temperature=0.0)
    return len(ids) / max(result.stats.prefill_s, 1e-6)


def _prompt_ids(engine: Engine, req: CompletionRequest) -> list[int]:
    """The request's prompt ids: chat messages through the chat template; a completion's prompt as given
    (raw, as OpenAI's and llama.cpp's completion routes take it), or with `suffix` the model's
    fill-in-the-middle prompt (its tokenizer's FIM tokens; refused for a model without them)."""
    if req.kind == "chat":
        return engine.encode(req.messages)
    if req.suffix is not None:
        return engine.prompts.encode_fim(req.prompt, req.suffix)
    return engine.encode(req.prompt, raw=True)
