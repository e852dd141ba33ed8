"""`localrun serve`: the HTTP server over the continuous-batching scheduler.

Starlette routes on uvicorn's event loop; the scheduler thread (runtime/scheduler.py) owns llama.cpp. A
handler validates the body (400 in the dialect's error shape on anything malformed), builds a job (prompt,
options, sampler chain) and submits it; responses come back on an asyncio queue. A client that disconnects
cancels its job at once, which frees its slot at the next step. A full waiting queue answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
import socket
import time
from dataclasses import dataclass
from typing import Optional

from ..errors import LocalrunError, UsageError
from ..runtime import Loaded, Response
from ..runtime.scheduler import Job, Scheduler
from . import openai
from .metrics import Metrics
from .openai import ApiError, ChatBody, CompletionBody


@dataclass
class ServeOptions:
    parallel: int = 4
    slot_ctx: int = 4096
    max_waiting: int = 64
    prefill_chunk: int = 256
    api_key: Optional[str] = None


class Service:
    """What the routes share: the loaded model, the scheduler and the metrics."""

    def __init__(self, loaded: Loaded, options: ServeOptions):
        self.loaded = loaded
        self.engine = loaded.engine
        self.options = options
        self.created = int(time.time())
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.metrics = Metrics()
        self.scheduler = Scheduler(
            self.engine, parallel=options.parallel, slot_ctx=options.slot_ctx, max_waiting=options.max_waiting,
            prefill_chunk=options.prefill_chunk, deliver=self._deliver, on_step=self.metrics.step,
        )
        self.metrics.watch(self.scheduler, options.parallel * options.slot_ctx)

    # scheduler thread -> event loop: one wake-up per step
    def _deliver(self, responses: list[tuple[Job, Response]]) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(_dispatch, responses)
            except RuntimeError:  # the loop closed in between: shutting down, nobody is listening
                pass


def _dispatch(responses: list[tuple[Job, Response]]) -> None:
    for job, response in responses:
        job.sink.put_nowait(response)
        if response.done and job.on_done is not None:
            job.on_done(response)  # counted whether or not anyone still reads the stream


def build_app(service: Service, on_started=None):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response as HttpResponse, StreamingResponse
    from starlette.routing import Route

    engine, scheduler, metrics = service.engine, service.scheduler, service.metrics
    model_id = service.loaded.name

    def error_response(exc: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(exc.status)).inc()
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def generate(request: Request, kind, endpoint: str):
        try:
            body = openai.parse_body(await request.body(), kind)
            job = openai.job_for(service, body)
        except ApiError as exc:
            return error_response(exc, endpoint)
        except LocalrunError as exc:
            return error_response(ApiError(400, exc.message), endpoint)
        except Exception as exc:  # noqa: BLE001 - e.g. a chat template that raises on these messages
            return error_response(ApiError(400, f"cannot build the prompt: {type(exc).__name__}: {exc}"), endpoint)
        job.sink = asyncio.Queue()
        job.on_done = lambda final: metrics.finished(final.stats)
        if not scheduler.submit(job):
            job.sampler.close()
            if scheduler.fatal:
                return error_response(ApiError(503, scheduler.fatal, type_="server_error"), endpoint)
            return error_response(ApiError(
                429, f"the server is busy: {service.options.max_waiting} requests are already waiting; retry shortly",
                type_="rate_limit_error", code="queue_full"), endpoint)
        chat = isinstance(body, ChatBody)
        rid = openai.new_id(chat)
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, job, scheduler))
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))

            def on_final(final: Response, status: str) -> None:
                metrics.requests.labels(endpoint, status).inc()

            def cancel() -> None:  # the client went away mid-stream: 499, as for a plain request
                watcher.cancel()
                scheduler.cancel(job)
                metrics.requests.labels(endpoint, "499").inc()

            async def events():
                try:
                    async for event in openai.sse(job, rid, chat, include_usage, model_id, on_final, cancel):
                        yield event
                finally:
                    watcher.cancel()

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            text, final = await _collect(job)
        except BaseException:
            scheduler.cancel(job)  # the handler itself was cancelled (shutdown): free the slot
            raise
        finally:
            watcher.cancel()
        if final.finish_reason not in openai.FINISH_REASONS:
            status = {"error": 500, "shutdown": 503}.get(final.finish_reason, 499)
            return error_response(ApiError(status, final.error or "the request was cancelled", type_="server_error"), endpoint)
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(openai.completion(rid, chat, model_id, text, final))

    async def completions(request: Request):
        return await generate(request, CompletionBody, "/v1/completions")

    async def chat_completions(request: Request):
        return await generate(request, ChatBody, "/v1/chat/completions")

    async def models(request: Request):
        metrics.requests.labels("/v1/models", "200").inc()
        return JSONResponse({"object": "list", "data": [{
            "id": model_id, "object": "model", "created": service.created, "owned_by": "localrun",
            "meta": {"n_ctx_slot": service.options.slot_ctx, "slots": service.options.parallel, "file": str(engine.path)},
        }]})

    async def health(request: Request):
        if scheduler.fatal:
            return JSONResponse({"status": "error", "error": scheduler.fatal}, status_code=503)
        return JSONResponse({"status": "ok", "slots_idle": scheduler.idle_slots(), "slots_processing":
                             len(scheduler.slots) - scheduler.idle_slots(), "requests_waiting": scheduler.stats.waiting})

    async def prometheus(request: Request):
        return HttpResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.loop = asyncio.get_running_loop()
        scheduler.start()
        if on_started:  # only now: uvicorn handles Ctrl-C from here on, so "Ctrl-C stops" is true once printed
            on_started()
        yield

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]

    async def http_error(request: Request, exc):
        # 404 for an unknown path and 405 for a wrong method, in the same OpenAI-style body as the rest
        what = "no such endpoint" if exc.status_code == 404 else f"{request.method} is not allowed here"
        return JSONResponse(ApiError(exc.status_code, f"{what}: {request.url.path}").body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: http_error, 405: http_error})
    return _require_key(app, service.options.api_key) if service.options.api_key else app


def _require_key(app, key: str):
    """ASGI wrapper: every path but /health needs `Authorization: Bearer KEY` (compared in constant time)."""
    expected = f"Bearer {key}".encode()
    body = json.dumps(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                               type_="invalid_request_error", code="invalid_api_key").body()).encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


async def _cancel_on_disconnect(request, job: Job, scheduler: Scheduler) -> None:
    """The body is read, so the next ASGI message is the client going away: free the slot at once."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scheduler.cancel(job)
            return


async def _collect(job: Job) -> tuple[str, Response]:
    parts = []
    while True:
        response: Response = await job.sink.get()
        parts.append(response.text)
        if response.done:
            return "".join(parts), response


# -- running it ------------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}: pick another --port or stop what uses it") from None
    sock.listen(2048)
    return sock


def serve(loaded: Loaded, options: ServeOptions, *, host: str, port: int, on_ready=None) -> None:
    """Bind, then serve until Ctrl-C/SIGTERM; in-flight streams get a few seconds to finish."""
    import uvicorn

    sock = bind(host, port)
    service = Service(loaded, options)
    bound = sock.getsockname()[1]
    app = build_app(service, on_started=(lambda: on_ready(bound)) if on_ready else None)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3, lifespan="on")

    interrupted = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # End the open requests first (503 JSON, or an error event on a stream), so that uvicorn's
            # graceful wait sees them finish: past it, uvicorn cancels them and logs a traceback.
            interrupted.append(sig == signal.SIGINT)
            service.scheduler.request_stop()
            super().handle_exit(sig, frame)

    server = Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        service.scheduler.stop()
        sock.close()
    if any(interrupted):
        # uvicorn re-raises the SIGINT it caught, which ends in KeyboardInterrupt (exit 130) unless SIGINT
        # was ignored when we started (a background job of a script): it stopped on Ctrl-C all the same.
        raise KeyboardInterrupt
