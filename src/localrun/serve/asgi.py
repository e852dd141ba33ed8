"""The ASGI application of one server: each dialect's routes (serve/routes), the operations' own, the guards every
request passes first (serve.guards: API key, body cap; the access log) and what happens as the server starts
and stops (lifespan)."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from ..runtime.sessions import Sessions, wait_for_saves
from . import access
from .endpoint import also, receiving
from .dialects import error_bytes
from .errors import Fault
from .guards import guarded
from .routes import anthropic, llama, native, ollama, ops, openai, page, rerank, responses
from .service import Service
from .stream import finish_answers


def build_app(service: Service, on_started=None):
    """The app for `service`; `on_started()` once it takes requests."""
    routes = [*openai.ROUTES, *anthropic.ROUTES, *responses.ROUTES, *ollama.ROUTES, *ops.ROUTES, *llama.ROUTES,
              *rerank.ROUTES, also(ops.models, "/models"), also(llama.completion, "/completions"),
              Route("/health", ops.health, methods=["GET"]), Route("/v1/health", ops.health, methods=["GET"]),
              Route("/metrics", ops.prometheus, methods=["GET"]), *page.ROUTES]
    if service.options.socket:  # localrun's own dialect (sessions, any .gguf path) only on the resident server's socket,
        routes += native.ROUTES  # which answers /api/version with what made it
    else:
        routes.append(Route("/api/version", ollama.version, methods=["GET"]))
    app = Starlette(routes=routes, lifespan=_lifespan(service, on_started), exception_handlers={404: _no_route, 405: _no_route})
    app.state.service = service
    app = receiving(app)
    app = guarded(app, service.options)
    return app if service.options.quiet or service.options.socket else access.access_log(app)


async def _no_route(request: Request, exc):
    """404 for an unknown path and 405 for a wrong method, in the shape of the dialect the path is under."""
    what = "no such endpoint" if exc.status_code == 404 else f"{request.method} is not allowed here"
    body = error_bytes(request.url.path, request.headers, Fault(exc.status_code, f"{what}: {request.url.path}"))
    return HttpResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None), media_type="application/json")


def _lifespan(service: Service, on_started):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.loop = asyncio.get_running_loop()
        await run_in_threadpool(lambda: None)  # anyio's worker threads, which the first request would start: now
        await run_in_threadpool(_warm_request_path)
        service.activity(0)  # the idle clock starts when requests can arrive
        if on_started:  # only now: uvicorn handles Ctrl-C from here on, so "Ctrl-C stops" is true once printed
            on_started()
        yield
        await run_in_threadpool(finish_answers, 30.0)  # answers still reading their prefix cache chunks off their slot
        await run_in_threadpool(wait_for_saves, 30.0)  # and the chunks handed to the writer, on disk before the process goes
    return lifespan


def _warm_request_path() -> None:
    """What the first request's path would open (the prefix cache's index, migrated if it is new): done before the
    port opens, so that the first request is as fast as the next."""
    try:
        Sessions.open().close()
    except Exception:  # noqa: BLE001 - a store that cannot open is said by the request that needs it, not here
        pass
