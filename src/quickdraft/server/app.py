"""HTTP transport: OpenAI-compatible routes over one Engine (FastAPI + uvicorn). No algorithm code.

Routes: /v1/completions, /v1/chat/completions (JSON or SSE stream), /v1/models, /health (503 while
loading), /metrics (Prometheus text). Client errors are OpenAI-shaped 4xx bodies (protocol.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.engine import Engine
from quickdraft.errors import ContextLengthError, QuickdraftError
from quickdraft.server.protocol import APIError, chunk, final_chunk, full_response, new_id, parse_request
from quickdraft.server.worker import DoneEvent, ErrorEvent, TokenEvent, Worker
from quickdraft.types import GenerationResult

MAX_BODY_BYTES = 4 * 1024 * 1024  # default request size limit (413 above it)


class Metrics:
    """Prometheus counters, named like vLLM's where they exist (own registry per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "quickdraft:requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.generated = Counter("quickdraft:generation_tokens", "generated tokens", registry=r)
        self.drafts = Counter("quickdraft:spec_decode_num_drafts", "draft/verify rounds with drafts", registry=r)
        self.draft_tokens = Counter("quickdraft:spec_decode_num_draft_tokens", "draft tokens", registry=r)
        self.accepted = Counter("quickdraft:spec_decode_num_accepted_tokens", "accepted draft tokens", registry=r)
        self.accepted_pos = Counter(
            "quickdraft:spec_decode_num_accepted_tokens_per_pos",
            "accepted draft tokens per draft position",
            ["position"],
            registry=r,
        )
        self.pending = Gauge("quickdraft:num_requests_pending", "running + waiting requests", registry=r)

    def observe(self, result: GenerationResult) -> None:
        s = result.stats
        self.generated.inc(s.num_new_tokens)
        self.drafts.inc(s.num_drafts)
        self.draft_tokens.inc(s.num_draft_tokens)
        self.accepted.inc(s.num_accepted_draft_tokens)
        for pos, n in enumerate(s.accepted_per_position):
            self.accepted_pos.labels(position=str(pos)).inc(n)


class CountRequests:
    """Pure ASGI middleware counting requests by route and status (BaseHTTPMiddleware would hide
    client disconnects from the handlers)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(route=scope["path"], status=str(status["code"])).inc()


class DisconnectWatch:
    """Hands out a request's worker events; every 0.2 s (also while tokens keep arriving) it checks
    whether the client went away, and then cancels the generation and returns None."""

    def __init__(self, request: Request, events: asyncio.Queue, cancel: threading.Event) -> None:
        self.request, self.events, self.cancel = request, events, cancel
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


def error_response(err: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def create_app(
    load_engine: Callable[[], Engine],
    model_name: str | None = None,
    max_queue: int = 8,
    default_max_tokens: int = 256,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """Build the app; `load_engine` runs in a background thread at start-up (health is 503 until done)."""
    state: dict = {"engine": None, "error": None, "name": model_name}
    worker, metrics = Worker(max_queue), Metrics()

    def load() -> None:
        try:
            engine = load_engine()
            state["name"] = state["name"] or engine.target_info.name
            state["engine"] = engine
        except Exception as exc:  # reported by /health
            state["error"] = str(exc)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=load, daemon=True, name="quickdraft-load").start()
        yield
        worker.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="quickdraft", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.quickdraft = worker, metrics, state

    def ready_engine() -> Engine:
        if state["engine"] is None:
            msg = f"model failed to load: {state['error']}" if state["error"] else "model is loading"
            raise APIError(503, msg, type_="service_unavailable")
        return state["engine"]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    app.add_middleware(CountRequests, metrics=metrics)

    @app.get("/health")
    async def health() -> Response:
        ready_engine()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        ready_engine()
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": state["name"], "object": "model", "created": 0, "owned_by": "quickdraft"}],
            }
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.pending.set(worker.pending)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def read_json(request: Request) -> object:
        """The parsed body: 415 unless JSON, 413 above max_body_bytes (checked on Content-Length before
        reading, and again while reading for bodies without one), 400 for anything json can't parse,
        nesting too deep for the parser included."""
        ctype = request.headers.get("content-type", "")
        if not ctype.split(";")[0].strip().lower() == "application/json":
            raise APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise APIError(413, f"request body of {int(declared)} bytes exceeds the limit of {max_body_bytes}")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {max_body_bytes} bytes")
        try:
            return json.loads(body)
        except RecursionError:
            raise APIError(400, "the request body is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, over-long integers
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None

    async def completion(request: Request, kind: str) -> Response:
        req = parse_request(await read_json(request), kind, default_max_tokens)
        engine = ready_engine()
        if req.model is not None and req.model != state["name"]:
            raise APIError(404, f"The model `{req.model}` does not exist.", "model", "NotFoundError", 404)
        try:  # the prompt's size is checked before it is tokenized (a huge text costs seconds)
            ids = engine.encode(req.messages if kind == "chat" else req.prompt)
            sampling = SamplingConfig(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed)
            stop = StopConfig(req.max_tokens, engine.target_info.eos_token_ids, tuple(req.stop))
            engine.check_length(len(ids), req.max_tokens)  # before the request takes a queue slot
        except ContextLengthError as exc:
            raise APIError(400, str(exc), "max_tokens", code="context_length_exceeded") from None
        except QuickdraftError as exc:
            raise APIError(400, str(exc)) from None
        if not worker.try_admit():
            return error_response(
                APIError(429, f"server busy: {worker.max_queue} requests already waiting", type_="rate_limit_exceeded"),
                headers={"Retry-After": "1"},
            )
        cancel = threading.Event()
        try:
            events = worker.run(engine, ids, sampling, stop, cancel)
        except BaseException:
            worker.release()
            raise
        rid, name = new_id(kind), state["name"]
        if req.stream:
            return StreamingResponse(
                sse(request, req, rid, name, events, cancel, len(ids)), media_type="text/event-stream"
            )
        try:
            result = await wait_result(request, events, cancel)
        finally:
            worker.release()
        if result is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        metrics.observe(result)
        return JSONResponse(full_response(req, rid, name, result, len(ids)))

    async def wait_result(request, events, cancel) -> GenerationResult | None:
        watch = DisconnectWatch(request, events, cancel)
        while True:
            event = await watch.next()
            if event is None:
                await drain(events)
                return None
            if isinstance(event, DoneEvent):
                return event.result
            if isinstance(event, ErrorEvent):
                raise event.error

    async def drain(events: asyncio.Queue) -> None:
        """Wait (off the request path) until the cancelled generation has really stopped."""
        while True:
            event = await events.get()
            if isinstance(event, (DoneEvent, ErrorEvent)):
                return

    async def sse(request, req, rid, name, events, cancel, prompt_tokens):
        def data(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        sent, finished = "", False
        watch = DisconnectWatch(request, events, cancel)
        try:
            if req.kind == "chat":
                yield data(chunk(req, rid, name, role=True))
            while True:
                event = await watch.next()
                if event is None:
                    return
                if isinstance(event, TokenEvent):
                    if event.text.startswith(sent) and len(event.text) > len(sent):
                        yield data(chunk(req, rid, name, text=event.text[len(sent) :]))
                        sent = event.text
                elif isinstance(event, DoneEvent):
                    result = event.result
                    if result.text.startswith(sent) and len(result.text) > len(sent):
                        yield data(chunk(req, rid, name, text=result.text[len(sent) :]))
                    yield data(chunk(req, rid, name, finish=result.finish_reason))
                    if req.include_usage or req.return_spec_stats:
                        yield data(final_chunk(req, rid, name, result, prompt_tokens))
                    metrics.observe(result)
                    finished = True
                    yield "data: [DONE]\n\n"
                    return
                else:  # an internal failure after the stream started: in-band error, then [DONE]
                    err = APIError(500, f"generation failed: {event.error}")
                    finished = True
                    yield data(err.body())
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not finished:
                cancel.set()
                asyncio.ensure_future(drain_then_release(events))
            else:
                worker.release()

    async def drain_then_release(events):
        try:
            await drain(events)
        finally:
            worker.release()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completion(request, "chat")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    return app
