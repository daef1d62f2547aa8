"""HTTP transport: OpenAI-compatible routes over one Engine (FastAPI + uvicorn). No algorithm code.

Routes: /v1/completions, /v1/chat/completions (JSON or SSE stream), /infill (llama.cpp's FIM shape),
/v1/models, /health (503 while loading; memory when ready), /metrics (Prometheus text, process memory).
Client errors are OpenAI-shaped 4xx bodies (protocol.py).
What a request passes before it runs is `admission.py`; how its result reaches the client (JSON,
SSE, cancellation on disconnect) is `streaming.py`; the counters are `metrics.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from quickdraft.engine import Engine
from quickdraft.server.admission import MAX_BODY_BYTES, Admission, queue_size
from quickdraft.server.batcher import Batcher
from quickdraft.server.infill import completion_body, infill_response
from quickdraft.server.metrics import CountRequests, Metrics, memory
from quickdraft.server.protocol import APIError, full_response, new_id
from quickdraft.server.streaming import sse, wait_result

__all__ = ["MAX_BODY_BYTES", "create_app", "error_response"]


def error_response(err: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def create_app(
    load_engine: Callable[[], Engine],
    model_name: str | None = None,
    max_queue: int | None = None,
    default_max_tokens: int = 256,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_batch: int | None = None,
    max_prompt_tokens: int | None = None,
    warm: bool = True,
) -> FastAPI:
    """Build the app; `load_engine` runs in a background thread at start-up, then a warm-up generation
    (`warm`; health is 503 until both are done). Requests run together, up to `max_batch` at once
    (None: fitted to the host; server/batcher.py) and up to `max_queue` wait (None: sized by free memory,
    `queue_size`); prompts over `max_prompt_tokens` get 400 (None: what this host prefilled in about a
    minute at warm-up)."""
    worker, metrics = Batcher(queue_size(max_queue, max_body_bytes), max_batch), Metrics()
    admission = Admission(load_engine, worker, model_name, default_max_tokens, max_body_bytes, max_prompt_tokens, warm)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=admission.load, daemon=True, name="quickdraft-load").start()
        yield
        worker.shutdown()

    app = FastAPI(title="quickdraft", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.quickdraft = worker, metrics, admission.state
    app.add_middleware(CountRequests, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    @app.get("/health")
    async def health() -> Response:
        admission.ready_engine()
        return JSONResponse({"status": "ok", **memory()})

    @app.get("/v1/models")
    async def models() -> Response:
        admission.ready_engine()
        card = {"id": admission.name, "object": "model", "created": 0, "owned_by": "quickdraft"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.pending.set(worker.pending)
        metrics.running.set(worker.running)
        metrics.waiting.set(max(0, worker.pending - worker.running))
        metrics.max_batch.set(worker.capacity)
        if admission.state["engine"] is not None:
            metrics.chose(admission.state["engine"].choices)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def busy() -> Response:
        text = f"server busy: {worker.capacity} requests running and {worker.max_queue} waiting"
        return error_response(APIError(429, text, type_="rate_limit_exceeded"), headers={"Retry-After": "1"})

    async def completion(request: Request, kind: str) -> Response:
        job = await admission.admit(request, kind)
        if job is None:
            return busy()
        rid, name = new_id(kind), admission.name
        if job.req.stream:
            return StreamingResponse(sse(request, job, rid, name, worker, metrics), media_type="text/event-stream")
        result = await wait_result(request, job, worker)
        if result is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        metrics.observe(result)
        return JSONResponse(full_response(job.req, rid, name, result, len(job.ids)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(request, "completion")

    @app.post("/infill")
    async def infill(request: Request) -> Response:
        job = admission.admit_body(completion_body(await admission.read_json(request)), "completion")
        if job is None:
            return busy()
        result = await wait_result(request, job, worker)
        if result is None:
            return Response(status_code=499)
        metrics.observe(result)
        return JSONResponse(infill_response(result, len(job.ids), admission.name))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completion(request, "chat")

    return app
