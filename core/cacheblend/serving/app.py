"""The ASGI app: OpenAI routes over one engine, its work done by the model thread's scheduler.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/documents`` (warm texts
into the server's store), ``GET /v1/models``; ``GET /health`` and ``GET /metrics`` (Prometheus) are
not behind the API key, every ``/v1`` route is when one is set.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..prompts.prepared import ContextLengthError
from . import openapi
from .metrics import Metrics
from .protocol import APIError, bad, parse_chat, parse_completion, parse_documents
from .responses import Formatter, sse
from .jobs import Event, Job, QueueFull
from .scheduler import Scheduler

RETRY_AFTER_S = 1
_POLL_S = 0.25  # how often a non-streaming request checks whether its client is still there


class _ClientGone(Exception):
    pass


@dataclass(frozen=True)
class SchedulerLimits:
    """How much work the model thread's scheduler takes on (``Scheduler``'s arguments of the same
    names; each at least 1)."""

    max_batch: int = 8  # sequences decoded together
    max_queue: int = 64  # waiting requests before 429
    max_prefill_tokens: int = 4096  # tokens the prefills between two decode steps may compute
    warm_on_miss: bool = True  # warm missed chunks when idle (False: a request's documents are warmed first)


def create_app(
    engine: Any,
    *,
    store_dir: str | Path | None = None,
    api_key: str | None = None,
    model_names: list[str] | None = None,
    limits: SchedulerLimits = SchedulerLimits(),
) -> FastAPI:
    """An app serving ``engine``; ``store_dir``: where /v1/documents warms to (the attached disk store)."""
    metrics = Metrics()
    scheduler = Scheduler(
        engine, max_batch=limits.max_batch, max_queue=limits.max_queue, max_prefill_tokens=limits.max_prefill_tokens,
        metrics=metrics, warm_on_miss=(lambda texts: engine.warm(texts, store_dir=store_dir)) if limits.warm_on_miss else None,
    )
    service = _Service(engine, scheduler, metrics, list(model_names or [engine.name]), api_key, store_dir)

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="cacheblend", lifespan=lifespan)
    app.state.scheduler = scheduler

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        metrics.request(request.url.path, exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        """Starlette's own errors (no such route, wrong method) in OpenAI's format too."""
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        error = APIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {}))
        return await api_error(request, error)

    names = service.names
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"],
                      openapi_extra=openapi.generation_extra(openapi.chat_body(names)))
    app.add_api_route("/v1/completions", service.completions, methods=["POST"],
                      openapi_extra=openapi.generation_extra(openapi.completion_body(names)))
    app.add_api_route("/v1/documents", service.documents, methods=["POST"], openapi_extra=openapi.documents_extra())
    app.add_api_route("/v1/models", service.models, methods=["GET"], openapi_extra=openapi.models_extra())
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/metrics", service.prometheus, methods=["GET"])
    return app


class _Service:
    """The routes' work: authorization, parsing, handing jobs to the scheduler, formatting."""

    def __init__(self, engine, scheduler: Scheduler, metrics: Metrics, names: list[str], api_key, store_dir):
        self.engine, self.scheduler, self.metrics, self.names = engine, scheduler, metrics, names
        self.api_key, self.store_dir = api_key, store_dir

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key", code="invalid_api_key")

    async def read_json(self, request: Request) -> Any:
        self.authorize(request)
        try:
            return json.loads(await request.body())
        except ValueError:
            raise bad("the request body is not valid JSON") from None

    async def chat_completions(self, request: Request):
        return await self.generate(request, "chat")

    async def completions(self, request: Request):
        return await self.generate(request, "text")

    async def generate(self, request: Request, kind: str):
        body = await self.read_json(request)
        parsed = parse_chat(body, self.engine.tokenizer) if kind == "chat" else parse_completion(body)
        if parsed.model not in self.names:
            raise APIError(404, f"The model '{parsed.model}' does not exist; this server serves {self.names}",
                           code="model_not_found", param="model")
        job = Job(parsed.prompt, parsed.max_tokens, parsed.sampling, parsed.stop, parsed.recompute_ratio,
                  parsed.documents)
        events = _submit(self.scheduler, job)
        try:
            first = await _next(events, job, request)
            if first.kind == "error":
                raise _api_error(first.error)
            fmt = Formatter(kind, parsed.model)
            if parsed.stream:
                self.metrics.request(request.url.path, 200)
                return StreamingResponse(_stream(events, job, fmt, parsed.include_usage), media_type="text/event-stream")
            answer = await _collect(events, job, request, fmt)
            self.metrics.request(request.url.path, 200)
            return JSONResponse(answer)
        except _ClientGone:
            self.metrics.request(request.url.path, 499)
            return Response(status_code=499)  # nobody reads it; the job is cancelled
        except asyncio.CancelledError:
            job.cancelled.set()
            raise

    async def documents(self, request: Request):
        """Warms texts into the server's store; ``cached`` says which were stored already."""
        texts = parse_documents(await self.read_json(request))
        engine = self.engine

        def warm():
            before = [engine.kv.is_warm(t) for t in texts]
            return before, engine.warm(texts, store_dir=self.store_dir)

        try:
            before, keys = await self.scheduler.call(warm)
        except QueueFull:
            raise _queue_full() from None
        except ValueError as exc:
            raise bad(str(exc), "documents") from None
        self.metrics.request(request.url.path, 200)
        data = [{"object": "document", "id": k, "cached": c} for k, c in zip(keys, before)]
        return {"object": "list", "data": data, "warmed": before.count(False)}

    async def models(self, request: Request):
        self.authorize(request)
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "cacheblend"} for n in self.names]
        return {"object": "list", "data": data}

    async def health(self):
        s = self.scheduler
        return {"status": "ok", "model": self.names[0], "active": s.active, "queued": s.queue_depth}

    async def prometheus(self):
        gauges = {
            "active_sequences": ("Sequences in the decode batch", lambda: self.scheduler.active),
            "store_memory_bytes": ("Chunk KV held in the memory store", lambda: self.engine.kv.stores.memory.nbytes),
        }
        misses = self.scheduler.misses
        if misses is not None:
            for name, help in _MISS_GAUGES.items():
                gauges[f"warm_on_miss_{name}"] = (help, lambda name=name: misses.counts()[name])
        return PlainTextResponse(self.metrics.render(gauges), media_type="text/plain; version=0.0.4")


_MISS_GAUGES = {
    "queued": "Missed chunks waiting to be warmed",
    "offered": "Missed chunks queued for warming so far",
    "warmed": "Missed chunks warmed so far",
    "preempted": "Warms of missed chunks ended by a request (each chunk queued again)",
    "dropped": "Missed chunks not queued (the queue was full)",
    "failed": "Missed chunks that could not be warmed",
}


def _submit(scheduler: Scheduler, job: Job) -> asyncio.Queue:
    try:
        return scheduler.submit(job)
    except QueueFull:
        raise _queue_full() from None


def _queue_full() -> APIError:
    return APIError(429, "The server is busy: its request queue is full; retry later", kind="rate_limit_error",
                    code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})


async def _next(events: asyncio.Queue, job: Job, request) -> Event:
    """The job's next event; gives up (cancelling the job) when the client disconnects."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), _POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                raise _ClientGone from None


async def _collect(events: asyncio.Queue, job: Job, request, fmt: Formatter) -> dict:
    """The whole answer of a non-streaming request (after its 'start' event)."""
    text, event = [], None
    while event is None or event.kind != "done":
        event = await _next(events, job, request)
        if event.kind == "error":
            raise _api_error(event.error)
        text.append(event.text)
    return fmt.response("".join(text), event.stats)


async def _stream(events: asyncio.Queue, job: Job, fmt: Formatter, include_usage: bool):
    """SSE for one job; a disconnect cancels this generator, and ``finally`` frees the slot."""
    try:
        opening = fmt.opening(include_usage)
        if opening:
            yield opening
        while True:
            event = await events.get()
            if event.kind == "text":
                yield fmt.chunk(event.text, with_usage=include_usage)
            elif event.kind == "error":
                yield sse(_api_error(event.error).body())
                break
            elif event.kind == "done":
                yield fmt.chunk(None, event.stats.finish_reason, with_usage=include_usage)
                if include_usage:
                    yield fmt.usage_chunk(event.stats)
                break
        yield sse("[DONE]")
    finally:
        job.cancelled.set()


def _api_error(exc: Exception) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):  # the engine's, worded as OpenAI's
        return bad(f"This model's maximum context length is {exc.window} tokens. "
                   f"However, your prompt has {exc.tokens} tokens.", "messages", code="context_length_exceeded")
    if isinstance(exc, ValueError):
        return bad(str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", sock=None) -> None:
    """Runs ``app`` with uvicorn until interrupted, on ``sock`` (a socket bound already, which it
    listens on: see ``command.bind``) or else on ``host``:``port``."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=None if sock is None else [sock])
    if not server.started:  # as uvicorn.run: a startup that failed is a failed command
        raise SystemExit(3)
