"""The steps every route takes, written once: `endpoint` makes a handler a route (its refusals shaped by its
dialect through the one error table, every answer counted for /metrics); `read_json` reads a body (parsed off the
event loop when it is big); `holding` takes the model a request names and gives it back however the request ends;
`answering` starts the answer on it (serve.prepare makes the request the runtime's; serve.stream.Answer answers it on
the request path `run` and `chat` take), which then owns the model until it ends; an answer comes back `whole` or
`streamed`, and a client that goes away stops it either way."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response as HttpResponse, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..errors import ContextOverflow, LocalrunError
from ..runtime import Response
from ..runtime.facts import ModelFacts, facts_of
from ..runtime.client.identity import build_identity
from ..runtime.options import parse_keep_alive
from ..runtime.serving.pool import Resident
from ..runtime.rerank import NotAReranker, check_reranker, reranker_spec
from ..runtime.serving.resident import embed_on
from . import access
from .asked import Asked
from .errors import STOPPING, EmbedFailed, LoadFailed, LoadRefused, PromptFailed, Refused, TooLong, is_refusal
from .prepare import prepared
from .service import Service
from .stream import Answer, answer_events
from .wire import BadJson, parse_json

BIG_BODY = 1 << 20  # bodies over this are parsed (and their prompts made) on a worker thread


def service_of(request: Request) -> Service:
    return request.app.state.service


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """What answers, as OpenAI's system_fingerprint says it (and llama-server's, "b" then its build): localrun's
    version and a digest of the build it runs (runtime.client.identity: the llama.cpp libraries, the settings), so that a
    client sees when the same seed may answer differently."""
    return f"b{__version__}-{hashlib.sha256(build_identity().encode()).hexdigest()[:8]}"


# -- the route --------------------------------------------------------------------------------------


def endpoint(path: str, dialect, methods: tuple[str, ...] = ("POST",)) -> Callable[[Callable], Route]:
    """A handler as the route for `path`: a refusal it raises (serve.errors) answers in its dialect's shape
    (`dialect.error_answer`), and every answer is counted for /metrics under `path` (a stream counts itself as it
    ends: `streamed`), its parameters written {id}."""
    label = re.sub(r"\{[^}]*\}", "{id}", path)

    def wrap(handler: Callable[[Request], Awaitable[HttpResponse]]) -> Route:
        async def route(request: Request) -> HttpResponse:
            request.state.endpoint = label
            try:
                response = await handler(request)
            except Exception as exc:
                if not is_refusal(exc):
                    raise  # a fault of the server's own: a traceback in the log, a 500
                response = refused(exc, dialect, getattr(request.state, "model", None))
            if not getattr(response, "counts_itself", False):
                count(request, response.status_code)
            return response

        route.__name__, route.__doc__ = handler.__name__, handler.__doc__
        return Route(path, route, methods=list(methods))
    return wrap


def also(route: Route, path: str) -> Route:
    """`route`'s handler at another path too (llama-server's unprefixed /chat/completions, /rerank...), counted for
    /metrics under the route's own."""
    return Route(path, route.endpoint, methods=sorted(route.methods - {"HEAD"}) if route.methods else None)


def refused(exc: BaseException, dialect, model: Optional[str] = None) -> JSONResponse:
    """A refusal as `dialect` answers it; `model`: the model the request named."""
    status, body = dialect.error_answer(exc, model)
    headers = {"Retry-After": "1"} if status in (429, 503) else None  # as every dialect's busy answer
    return JSONResponse(body, status_code=status, headers=headers)


def count(request: Request, status: int) -> None:
    service_of(request).metrics.requests.labels(request.state.endpoint, str(status)).inc()


def named(request: Request, model: Optional[str]) -> None:
    """The model a request names: in its access log line, and in its dialect's errors (Ollama's 'model not found')."""
    access.note(request, model=model)
    request.state.model = model


def answered_by(request: Request, asked: Asked, resident: Resident) -> str:
    """The model an answer says it came from: the name the request used (as OpenAI echoes it), else the one the
    model is listed by (the served model's --alias: Service.name_of)."""
    return asked.model or service_of(request).name_of(resident)


# -- reading a body ---------------------------------------------------------------------------------


async def read_body(request: Request) -> bytes:
    try:
        return await request.body()
    except ClientDisconnect:  # it went away while sending: nobody reads an answer
        raise Refused("the client went away before its request was read", status=499) from None


async def off_loop_if_big(size: int, fn, *args):
    """`fn(*args)` for a request body of `size` bytes: on a worker thread when the body is large (its parse or
    prompt takes long enough to hold up every other request, /health included), else here at once."""
    return await run_in_threadpool(fn, *args) if size > BIG_BODY else fn(*args)


async def read_json(request: Request, *, malformed: str = "malformed JSON body", empty: Optional[bytes] = None) -> Any:
    """The body's JSON (`empty`: what an empty body reads as); 400 for what is not JSON, `malformed` saying so."""
    raw = await read_body(request) or empty or b""
    try:
        return await off_loop_if_big(len(raw), parse_json, raw)
    except BadJson as exc:
        raise Refused(f"{malformed}: {exc}") from None


# -- holding a model --------------------------------------------------------------------------------


@dataclass
class Held:
    """A model taken for one request: given back when the request ends, or by the answer it starts."""

    resident: Resident
    keep_alive: Optional[float]  # the request's own (None: the server's)
    load_s: float  # what loading it took for this request (0: it was loaded already)
    facts: ModelFacts
    ours: bool = True  # the reference is still this request's to give back (not yet an answer's)


@contextlib.asynccontextmanager
async def holding(request: Request, asked: Asked, kind: str = "batch") -> AsyncIterator[Held]:
    """The model the request names (the server's own when it names none), loaded as `kind` (batch: answers; embed:
    embeddings; rerank: a reranker, refused before it loads when it is none) with the request's load options, a
    reference taken and given back on leaving, unless an answer took it over (`answering`)."""
    service = service_of(request)
    held = await _take(service, asked, kind)
    try:
        yield held
    finally:
        if held.ours:
            service.pool.release(held.resident, held.keep_alive)


async def _take(service: Service, asked: Asked, kind: str) -> Held:
    ref, spec = _model_ref(service, asked), _load_spec(service, asked, kind)
    keep_alive = None
    if asked.keep_alive is not None:
        try:
            keep_alive = parse_keep_alive(asked.keep_alive)
        except LocalrunError as exc:
            raise Refused(exc.message, "keep_alive") from None
    if service.stopping:
        raise Refused(STOPPING, status=503)
    resident = service.pool.take(ref, spec)  # loaded already (most requests): no hop to a worker thread and back
    if resident is not None:
        return Held(resident, keep_alive, 0.0, facts_of(resident))
    if kind == "rerank":
        await _check_reranker(ref)
    started = time.perf_counter()
    try:
        # The command line's model, back after an eject: pinned again, as it was. A client that goes away while
        # the load waits for room stops it waiting (nothing is unloaded or loaded for nobody).
        async with gone_flag() as gone:
            resident, fresh = await run_in_threadpool(lambda: service.pool.acquire(ref, spec, pinned=ref == service.served,
                                                                                   cancelled=gone.is_set))
    except LocalrunError as exc:  # e.g. a file that would not load: this request fails, the server goes on
        raise LoadFailed(exc, ref) from None
    service.remember(resident)
    return Held(resident, keep_alive, (time.perf_counter() - started) if fresh else 0.0, facts_of(resident))


def _model_ref(service: Service, asked: Asked) -> str:
    """What the request's model name loads. The id /v1/models and /api/ps list for a model loaded from a path (its file
    name) names it on every endpoint, whichever kind of context (chat, embeddings) it was loaded for, loaded or not."""
    ref = asked.model or service.options.model
    if not ref:
        raise Refused("no model given and this server was started without one: name one in 'model'", "model")
    ref = service.resolve(ref)
    if not service.options.socket and ref.startswith(("/", ".", "~")) and not ref.lower().endswith(".gguf"):
        # Over HTTP a path must at least be a .gguf file: no probing of the server's other files.
        raise Refused(f"model {ref!r} is not a pulled model nor a .gguf file: see /v1/models", "model", status=404,
                      code="model_not_found")
    return ref


async def _check_reranker(ref: str) -> None:
    """A model asked to rerank that is none: refused naming it before it loads (its file's header says)."""
    try:
        await run_in_threadpool(check_reranker, ref)
    except NotAReranker as exc:
        raise Refused(exc.message, "model", code="model_not_reranker") from None
    except LocalrunError as exc:  # not here: a server does not pull for a request
        raise LoadFailed(exc, ref) from None


def _load_spec(service: Service, asked: Asked, kind: str):
    """The server's load options with the request's over them, checked before any model is touched (a bad value never
    unloads the one in use)."""
    spec = service.options.spec
    if asked.load:
        spec = replace(spec, **asked.load)
        try:
            spec.check()
        except LocalrunError as exc:
            raise LoadRefused(exc) from None
    if kind == "rerank":
        return reranker_spec(replace(spec, parallel=1))  # an embeddings context with rank pooling, its requests in turn
    return spec if kind == spec.kind else replace(spec, kind=kind, parallel=1)


# -- answering --------------------------------------------------------------------------------------


async def answering(request: Request, held: Held, asked: Asked) -> Answer:
    """The request answered on the held model through the request path run and chat take, once it is taken (it fits,
    it has a slot or waits for one); what refused it raised as a refusal (serve.errors). The answer gives the model
    back when it ends. A large request is made the runtime's on a worker thread: other requests go on meanwhile."""
    size = int(request.headers.get("content-length") or 0)
    try:
        wanted, tools = await off_loop_if_big(size, prepared, asked, held.facts)
    except Exception as exc:  # noqa: BLE001 - worded by the dialect; the model is given back by `holding`
        raise _refusal(exc, asked) from None
    access.note(request, model=answered_by(request, asked, held.resident))
    metrics, pool = service_of(request).metrics, service_of(request).pool

    def on_end(final: Optional[Response]) -> None:  # on the answer's thread, its state saved
        if final is not None and final.stats is not None:
            metrics.finished(final.stats)
        pool.release(held.resident, held.keep_alive)

    answer = Answer(held.resident, wanted, tools=tools, on_end=on_end)
    held.ours = False  # from here on the answer's thread gives it back, however it ends
    try:
        await answer.start()
    except BaseException as exc:
        answer.cancel()
        if not isinstance(exc, Exception):
            raise
        raise _refusal(exc, asked) from None
    _say_dropped(answer)
    return answer


def _refusal(exc: Exception, asked: Asked) -> Exception:
    """Why the request path did not take a request, as the table words it: a prompt over the context names the field
    that holds it; what no table knows (a chat template raising on these messages) is the prompt's fault."""
    if isinstance(exc, ContextOverflow):
        return TooLong(exc, "messages" if asked.messages is not None else "prompt")
    return exc if is_refusal(exc) else PromptFailed(exc)


def _say_dropped(answer: Answer) -> None:
    if answer.prompt.dropped:
        resident = answer.resident
        print(f"notice: the conversation did not fit {resident.name}'s context of {resident.slot_ctx} tokens: its"
              f" {answer.prompt.dropped} oldest messages were left out ({answer.prompt_tokens} prompt tokens kept)",
              file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def cancelled_on_disconnect(request: Request, answer: Answer) -> AsyncIterator[None]:
    """While inside, the client going away stops the answer (its slot freed at the next step)."""
    async def watch() -> None:
        await until_gone(request.receive)
        answer.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        watcher.cancel()


async def whole(request: Request, answer: Answer) -> tuple[str, Response]:
    """The whole answer (not streamed); the client going away stops it. Refused when it did not finish."""
    async with cancelled_on_disconnect(request, answer):
        try:
            text, final = await answer.collect()
        except BaseException:
            answer.cancel()  # the handler itself was cancelled (shutdown), or the answer failed: free the slot
            raise
    access.note(request, stats=final.stats)
    return text, final


async def counted_events(request: Request, answer: Answer):
    """The answer's events, counted as they end (status and tokens) for /metrics and the access log."""
    async for event in answer_events(answer):
        if event.kind in ("done", "failed"):
            count(request, 200 if event.kind == "done" else 500)
            if event.final is not None and event.final.stats is not None:
                access.note(request, stats=event.final.stats)
        yield event


class Streamed(StreamingResponse):
    counts_itself = True  # counted as it ends (counted_events), not when its head goes out


def streamed(request: Request, answer: Answer, wire: AsyncIterator[str], media_type: str = "text/event-stream") -> Streamed:
    """A streamed answer written by `wire` (a dialect's writer over `counted_events`); a client that goes away
    mid-stream stops the answer (499)."""
    async def body():
        finished = False
        try:
            async for line in wire:
                yield line
            finished = True
        finally:
            if not finished:
                answer.cancel()
                count(request, 499)
                access.note(request, status=499)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"} if media_type == "text/event-stream" else None
    return Streamed(body(), media_type=media_type, headers=headers)


async def embeddings_of(request: Request, asked: Asked, texts: list, *, truncate: bool = True, dimensions: Optional[int] = None):
    """(the model's name, runtime.embed.Embeddings, seconds its load took) for `texts` on the model the request names,
    loaded as an embeddings context."""
    async with holding(request, asked, kind="embed") as held:
        try:
            result = await run_in_threadpool(embed_on, held.resident, texts, truncate=truncate, dimensions=dimensions)
        except LocalrunError as exc:
            raise EmbedFailed(exc) from None
    return answered_by(request, asked, held.resident), result, held.load_s


# -- the client going away --------------------------------------------------------------------------

_receive: ContextVar = ContextVar("localrun_receive", default=None)  # the request's ASGI receive (a load that waits)


def receiving(app):
    """ASGI wrapper: each HTTP request's `receive`, for code that has no Request at hand (a load that waits)."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "http":
            _receive.set(receive)
        await app(scope, receive, send)
    return wrapped


async def until_gone(receive) -> None:
    """Returns when the client goes away: once the body is read, the next ASGI message says so."""
    while (await receive())["type"] != "http.disconnect":
        pass


@contextlib.asynccontextmanager
async def gone_flag() -> AsyncIterator[threading.Event]:
    """An Event set when this request's client goes away, for work on a worker thread to stop waiting."""
    receive, gone = _receive.get(), threading.Event()

    async def watch() -> None:
        await until_gone(receive)
        gone.set()

    watcher = asyncio.ensure_future(watch()) if receive is not None else None
    try:
        yield gone
    finally:
        if watcher is not None:
            watcher.cancel()
