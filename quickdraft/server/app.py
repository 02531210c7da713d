"""The FastAPI application: routes, error handlers, and the engine's life cycle.

    app = create_app(ServerSettings(model_name="smollm2-135m-instruct"))
    attach_engine(app, engine)   # from any thread; GET /health is 503 until then

Generation requests are parsed and checked here (400/404 at once), queued on the engine worker
(429 when the queue is full), then answered whole or streamed as server-sent events. A client
that goes away cancels its job; stopping the app cancels every job and ends the worker.
"""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from quickdraft.async_engine import Cancelled, Job, QueueFull
from quickdraft.engine import Engine, Failed, Finished, TextDelta
from quickdraft.errors import ModelError, UsageError
from quickdraft.server import generation, responses
from quickdraft.server.errors import APIError, invalid, loading, queue_full
from quickdraft.server.metrics import ServerMetrics
from quickdraft.server.middleware import (
    AllowedHostsMiddleware,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    JsonBodyMiddleware,
)
from quickdraft.server.page import add_page_routes
from quickdraft.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, parse_request
from quickdraft.server.settings import ServerSettings
from quickdraft.server.worker import EngineWorker

WORKER_STOP_SECONDS = 10.0  # how long shutdown waits for the running step to end


class ServerState:
    """What the routes share: settings, metrics, and the engine worker once the model is loaded."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.started = int(time.time())
        self.worker: EngineWorker | None = None

    def ready_worker(self) -> EngineWorker:
        if self.worker is None:
            raise loading()
        return self.worker


def create_app(settings: ServerSettings) -> FastAPI:
    state = ServerState(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if state.worker is not None:
            state.worker.stop(WORKER_STOP_SECONDS)

    app = FastAPI(title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.quickdraft = state
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)  # the last added runs first
    app.add_middleware(JsonBodyMiddleware)
    if settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    if settings.allowed_hosts is not None:
        app.add_middleware(AllowedHostsMiddleware, hosts=settings.allowed_hosts)
    _add_error_handlers(app)
    _add_info_routes(app, state)
    _add_generation_routes(app, state)
    add_page_routes(app)
    return app


def attach_engine(app: FastAPI, engine: Engine) -> None:
    """Start serving `engine` (callable from the thread that loaded it).

    Everything loaded by now (torch, transformers, the model, its tokenizer) lives as long as the server, so it is
    frozen out of the garbage collector's reach (`gc.freeze`): a full collection then scans only what requests
    allocate. Over the whole loaded heap one took 220-260 ms, and stalled every stream for that long (#20, stop 45).
    Loading's own garbage is collected first, so that nothing frozen is already dead.
    """
    gc.collect()
    gc.freeze()
    state: ServerState = app.state.quickdraft
    worker = EngineWorker(engine, state.metrics, state.settings.max_queue)
    worker.start()
    state.worker = worker


def end_jobs(app: FastAPI) -> None:
    """Cancel every job now, without waiting (callable on the event loop): each stream still ends with an error
    event and [DONE], each waiting request with a 503."""
    worker = app.state.quickdraft.worker
    if worker is not None:
        worker.request_stop()


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with HEAD
    async def health() -> JSONResponse:
        ready = state.worker is not None
        return JSONResponse({"status": "ok" if ready else "loading"}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        running, waiting = state.worker.load() if state.worker else (0, 0)
        return PlainTextResponse(state.metrics.render(running, waiting), media_type="text/plain; version=0.0.4")

    def served_model() -> dict:
        return {"id": state.settings.model_name, "object": "model", "created": state.started, "owned_by": "quickdraft"}

    @app.get("/v1/speculation")  # what the playground's controls may offer
    async def speculation() -> dict:
        engine = state.ready_worker().engine
        return {
            "model": state.settings.model_name,
            "drafter": engine.spec.drafter,
            "k": engine.spec.k,
            "k_max": engine.spec.k_max,
            "drafters": list(dict.fromkeys([engine.spec.drafter, "ngram", "none"])),
            "max_batch": engine.max_batch,
            "max_tokens": state.settings.default_max_tokens,
            "max_context": engine.target.info.max_context,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [served_model()]}

    @app.get("/v1/models/{model_id:path}")  # a served name may be a path
    async def model(model_id: str) -> dict:
        if model_id != state.settings.model_name:
            raise APIError(
                404,
                f"the model '{model_id}' does not exist here; this server serves '{state.settings.model_name}'",
                param="model",
                code="model_not_found",
            )
        return served_model()


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        worker = state.ready_worker()
        chat = parse_request(ChatCompletionRequest, await request.body())
        generation.check_model(chat, state.settings)
        prompt_ids = await generation.chat_prompt_ids(worker.engine, chat)
        return await _answer(state, worker, request, chat, prompt_ids, responses.ChatFormat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        worker = state.ready_worker()
        completion = parse_request(CompletionRequest, await request.body())
        generation.check_model(completion, state.settings)
        prompt_ids = await generation.completion_prompt_ids(worker.engine, completion)
        return await _answer(state, worker, request, completion, prompt_ids, responses.TextFormat)


async def _answer(
    state: ServerState,
    worker: EngineWorker,
    request: Request,
    body: GenerationRequest,
    prompt_ids: list[int],
    form: responses.ResponseFormat,
) -> Response:
    """Queue the job, then stream it or wait for it; the job is cancelled if the client leaves."""
    engine = worker.engine
    budget = generation.output_budget(
        body, len(prompt_ids), engine.target.info.max_context, state.settings.default_max_tokens
    )
    spec = generation.spec_config(body, engine)
    job = Job(prompt_ids, generation.sampling_params(body, budget), spec)
    try:
        worker.submit(job)
    except QueueFull:
        state.metrics.count_rejected("queue_full")
        raise queue_full(state.settings.max_queue) from None
    header = responses.ResponseHeader.new(form.id_prefix, state.settings.model_name)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        include_spans = bool(body.quickdraft and body.quickdraft.spans)
        stream = responses.sse_stream(form, header, _job_events(job), spec, include_usage, include_spans)
        return _JobStreamingResponse(
            stream, worker, job, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    finished = await _result_unless_disconnected(job, worker, request)
    if finished is None:
        return Response(status_code=499)  # "client closed request": nobody is left to read it
    return JSONResponse(responses.completion(form, header, finished, spec))


async def _job_events(job: Job) -> AsyncIterator[TextDelta | Finished]:
    """The job's engine events; a failure or cancellation becomes an APIError."""
    while True:
        event = await job.next_event()
        if isinstance(event, Failed):
            raise APIError(500, f"generation failed: {event.error}", type="server_error")
        if isinstance(event, Cancelled):
            raise APIError(
                503, "the request was cancelled: the server is shutting down", type="server_error", code="cancelled"
            )
        yield event
        if isinstance(event, Finished):
            return


async def _result_unless_disconnected(job: Job, worker: EngineWorker, request: Request) -> Finished | None:
    """The job's Finished event, or None (job cancelled) when the client disconnects first."""
    result = asyncio.ensure_future(_last_event(job))
    disconnect = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({result, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        return result.result() if result.done() else None
    finally:
        disconnect.cancel()
        result.cancel()
        worker.cancel(job)


async def _last_event(job: Job) -> Finished:
    async for event in _job_events(job):
        if isinstance(event, Finished):
            return event
    raise AssertionError("a job's events end with Finished")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _JobStreamingResponse(StreamingResponse):
    """A stream that cancels its job however it ends: finished, client gone, or task cancelled."""

    def __init__(self, content: AsyncIterator[str], worker: EngineWorker, job: Job, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._worker = worker
        self._job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._worker.cancel(self._job)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(UsageError)
    async def usage_error(request: Request, exc: UsageError) -> JSONResponse:
        return invalid(str(exc)).response()

    @app.exception_handler(ModelError)
    async def model_error(request: Request, exc: ModelError) -> JSONResponse:
        return APIError(500, str(exc), type="server_error").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, message, code=code, headers=exc.headers).response()

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        logging.getLogger("uvicorn.error").warning(f"{client} disconnected before sending its whole request")
        return Response(status_code=400)  # nobody reads it: the connection is gone

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()
