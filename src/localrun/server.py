"""`localrun serve`: an OpenAI-compatible HTTP API over the continuous-batching scheduler.

Starlette routes on uvicorn's event loop; the scheduler thread (scheduler.py) owns llama.cpp. A
handler validates the body (400 with an OpenAI-style error body on anything malformed), renders and
tokenises the prompt, checks it fits a slot, builds the request's sampler chain, and submits a Job;
events come back on an asyncio queue. A client that disconnects cancels its job at once, which frees
its slot at the next step. A full waiting queue answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import LocalrunError, UsageError
from .runner import Loaded
from .scheduler import Finish, Job, Piece, Scheduler

FINISH_REASONS = {"stop": "stop", "length": "length"}


# -- request bodies --------------------------------------------------------------------------------


class _Body(BaseModel):
    # Unknown fields are refused (as OpenAI's API does) rather than silently ignored.
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=5.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(None, ge=0.0, le=10.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 2)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[dict[str, bool]] = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    user: Optional[str] = None
    logit_bias: Optional[dict[int, float]] = None
    response_format: Optional[dict[str, Any]] = None
    ignore_eos: bool = Field(False, description="llama.cpp server's extension: generate exactly max_tokens")
    # Sent (mostly with their off values) by common clients: accepted when off, refused when asked for.
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[Any]] = None
    function_call: Union[str, dict[str, Any], None] = None
    store: Optional[bool] = None
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None

    def unsupported(self) -> Optional[str]:
        """The first feature asked for that localrun does not do, or None."""
        if self.logprobs or self.top_logprobs:
            return "logprobs"
        if self.tools or self.functions or self.tool_choice not in (None, "none") or self.function_call not in (None, "none"):
            return "tools" if (self.tools or self.tool_choice not in (None, "none")) else "functions"
        return None


class CompletionBody(_Body):
    prompt: Union[str, list[int]]
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def unsupported(self) -> Optional[str]:
        if self.echo:
            return "echo"
        if self.best_of not in (None, 1):
            return "best_of"
        if self.suffix:
            return "suffix"
        return super().unsupported()


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: harmless
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[_Part], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _validation_error(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"unknown or unsupported field {where!r}", param=where)
    if first["type"] == "missing":
        return ApiError(400, f"missing required field {where!r}", param=where)
    return ApiError(400, f"invalid {where!r}: {first['msg']}", param=where)


# -- the service -----------------------------------------------------------------------------------


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
    def _deliver(self, events: list[tuple[Job, object]]) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(_dispatch, events)
            except RuntimeError:  # the loop closed in between: shutting down, nobody is listening
                pass

    # -- building a job ---------------------------------------------------------------------------

    def prompt_for(self, body: Union[CompletionBody, ChatBody]) -> tuple[list[int], list[str]]:
        """Prompt tokens and extra stops for a request (a base model chats over a plain transcript)."""
        from .chat import PLAIN_STOP, render_messages

        engine = self.engine
        extra_stops: list[str] = []
        if isinstance(body, ChatBody):
            messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
            text = render_messages(engine, messages)
            if engine.chat_template is None:
                extra_stops.append(PLAIN_STOP)
            tokens = engine.tokenize(text, add_special=True, parse_special=True)
        elif isinstance(body.prompt, list):
            bad = [t for t in body.prompt if not 0 <= t < engine.n_vocab]
            if bad:
                raise ApiError(400, f"token id {bad[0]} is out of range: this model's ids run 0..{engine.n_vocab - 1}", param="prompt")
            tokens = list(body.prompt)
        else:
            tokens = engine.tokenize(body.prompt, add_special=True, parse_special=True)
        if not tokens:
            raise ApiError(400, "empty prompt", param="prompt")
        if len(tokens) >= self.options.slot_ctx:
            raise ApiError(
                400,
                f"the prompt is {len(tokens)} tokens but a slot's context holds {self.options.slot_ctx}: "
                "shorten it, or restart the server with a larger --ctx",
                param="messages" if isinstance(body, ChatBody) else "prompt", code="context_length_exceeded",
            )
        return tokens, extra_stops

    def job_for(self, body: Union[CompletionBody, ChatBody]) -> Job:
        from .sampling import Sampler, SamplingOptions

        feature = body.unsupported()
        if feature is not None:
            raise ApiError(400, f"{feature!r} is not supported by localrun serve: leave it out", param=feature)
        tokens, extra_stops = self.prompt_for(body)
        base = self.loaded.sampling
        update: dict[str, Any] = {
            k: getattr(body, k)
            for k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")
            if getattr(body, k) is not None
        }
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if any(s == "" for s in stops):
            raise ApiError(400, "a stop sequence cannot be empty", param="stop")
        update["stop"] = list(dict.fromkeys([*base.stop, *stops, *extra_stops]))
        if body.logit_bias is not None:
            update["logit_bias"] = {**base.logit_bias, **body.logit_bias}
        update.update(_response_format(body.response_format))
        try:
            options = SamplingOptions.model_validate({**base.model_dump(), **update})
        except ValidationError as exc:
            raise _validation_error(exc) from None
        room = self.options.slot_ctx - len(tokens)
        asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
        if asked is None:
            asked = base.max_tokens if base.max_tokens > 0 else room
        asked = max(1, min(asked, room))
        if body.ignore_eos:
            if options.grammar is not None or options.json_schema is not None:
                raise ApiError(400, "ignore_eos cannot combine with response_format (the grammar decides where the text ends)", param="ignore_eos")
            options = options.model_copy(update={"min_tokens": asked})
        try:
            sampler = Sampler(self.engine, options)
        except LocalrunError as exc:
            param = "logit_bias" if "logit-bias" in exc.message else "response_format"  # the two that can fail here
            raise ApiError(400, exc.message.replace("--", ""), param=param) from None
        return Job(prompt=tokens, sampler=sampler, max_tokens=asked, stops=options.stop)


def _response_format(fmt: Optional[dict]) -> dict:
    if not fmt or fmt.get("type") in (None, "text"):
        return {}
    if fmt.get("type") == "json_object":
        from llama_cpp.llama_grammar import JSON_GBNF

        return {"grammar": JSON_GBNF}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}", param="response_format")
        return {"json_schema": schema}
    raise ApiError(400, f"unsupported response_format type {fmt.get('type')!r}: use text, json_object or json_schema", param="response_format")


def _dispatch(events: list[tuple[Job, object]]) -> None:
    for job, event in events:
        job.sink.put_nowait(event)


# -- metrics ---------------------------------------------------------------------------------------


class Metrics:
    """Prometheus metrics in their own registry (prometheus_client is thread-safe)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("localrun_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("localrun_prompt_tokens", "prompt tokens received", registry=r)
        self.cached_tokens = Counter("localrun_prompt_tokens_cached", "prompt tokens reused from the KV cache", registry=r)
        self.generated_tokens = Counter("localrun_generated_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(
            "localrun_time_to_first_token_seconds", "from request to first token", registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tpot = Histogram(
            "localrun_time_per_output_token_seconds", "per token after the first", registry=r,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1),
        )
        self.batch_tokens = Histogram(
            "localrun_batch_tokens", "tokens per decode step (decoding sequences plus prompt chunks)", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        )
        self.decoding = Histogram(
            "localrun_batch_sequences", "sequences decoding together per step", registry=r,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
        )

    def watch(self, scheduler: Scheduler, kv_capacity: int) -> None:
        from prometheus_client import Gauge

        r = self.registry
        Gauge("localrun_requests_running", "requests holding a slot", registry=r).set_function(lambda: scheduler.stats.running)
        Gauge("localrun_requests_waiting", "requests queued for a slot", registry=r).set_function(lambda: scheduler.stats.waiting)
        Gauge("localrun_kv_cache_tokens", "tokens held in the slots' KV sequences", registry=r).set_function(lambda: scheduler.stats.kv_tokens)
        Gauge("localrun_kv_cache_capacity_tokens", "tokens the KV cache holds", registry=r).set(kv_capacity)
        Gauge("localrun_slots", "sequence slots", registry=r).set(len(scheduler.slots))

    def step(self, batch_tokens: int, decoding: int) -> None:
        self.batch_tokens.observe(batch_tokens)
        if decoding:
            self.decoding.observe(decoding)

    def finished(self, fin: Finish) -> None:
        self.prompt_tokens.inc(fin.prompt_tokens)
        self.cached_tokens.inc(fin.cached_tokens)
        self.generated_tokens.inc(fin.completion_tokens)
        if fin.completion_tokens:
            self.ttft.observe(fin.ttft_s)
        if fin.completion_tokens > 1:
            self.tpot.observe(fin.tpot_s)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# -- the app ---------------------------------------------------------------------------------------


def build_app(service: Service, on_started=None):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    engine, scheduler, metrics = service.engine, service.scheduler, service.metrics
    model_id = service.loaded.name

    def error_response(exc: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(exc.status)).inc()
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def read_body(request: Request, kind: type[BaseModel]) -> Any:
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object")
        try:
            return kind.model_validate(data)
        except ValidationError as exc:
            raise _validation_error(exc) from None

    async def generate(request: Request, kind: type[BaseModel], endpoint: str):
        try:
            body = await read_body(request, kind)
            job = service.job_for(body)
        except ApiError as exc:
            return error_response(exc, endpoint)
        except LocalrunError as exc:
            return error_response(ApiError(400, exc.message), endpoint)
        except Exception as exc:  # noqa: BLE001 - e.g. a chat template that raises on these messages
            return error_response(ApiError(400, f"cannot build the prompt: {type(exc).__name__}: {exc}"), endpoint)
        job.sink = asyncio.Queue()
        if not scheduler.submit(job):
            job.sampler.close()
            if scheduler.fatal:
                return error_response(ApiError(503, scheduler.fatal, type_="server_error"), endpoint)
            return error_response(ApiError(
                429, f"the server is busy: {service.options.max_waiting} requests are already waiting; retry shortly",
                type_="rate_limit_error", code="queue_full"), endpoint)
        chat = isinstance(body, ChatBody)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, job, scheduler))
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                _sse(job, rid, chat, include_usage, model_id, metrics, scheduler, watcher, endpoint),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            text, fin = await _collect(job)
        except BaseException:
            scheduler.cancel(job)  # the handler itself was cancelled (shutdown): free the slot
            raise
        finally:
            watcher.cancel()
        metrics.finished(fin)
        if fin.reason not in FINISH_REASONS:
            status = {"error": 500, "shutdown": 503}.get(fin.reason, 499)
            return error_response(ApiError(status, fin.error or "the request was cancelled", type_="server_error"), endpoint)
        metrics.requests.labels(endpoint, "200").inc()
        choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH_REASONS[fin.reason], "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model_id, "choices": [choice], "usage": _usage(fin), "timings": _timings(fin),
        })

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
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

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


async def _collect(job: Job) -> tuple[str, Finish]:
    parts = []
    while True:
        event = await job.sink.get()
        if isinstance(event, Piece):
            parts.append(event.text)
        else:
            return "".join(parts), event


def _usage(fin: Finish) -> dict:
    return {
        "prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def _timings(fin: Finish) -> dict:
    return {"ttft_s": round(fin.ttft_s, 6), "tpot_s": round(fin.tpot_s, 6)}


async def _sse(job: Job, rid: str, chat: bool, include_usage: bool, model_id: str, metrics: "Metrics",
               scheduler: Scheduler, watcher, endpoint: str) -> AsyncIterator[str]:
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: Optional[str], finish: Optional[str], *, role: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        event = {"id": rid, "object": kind, "created": created, "model": model_id, "choices": [choice]}
        if include_usage:
            event["usage"] = None  # as OpenAI streams it: null on every chunk, the totals in a last chunk
        return _event(event)

    finished = False
    try:
        if chat:
            yield chunk(None, None, role=True)
        pending = None
        while True:
            event, pending = pending or await job.sink.get(), None
            if isinstance(event, Piece):
                text = event.text
                while not job.sink.empty():  # coalesce the pieces already here; keep the end for the next turn
                    more = job.sink.get_nowait()
                    if not isinstance(more, Piece):
                        pending = more
                        break
                    text += more.text
                yield chunk(text, None)
                continue
            finished = True
            fin: Finish = event
            metrics.finished(fin)
            if fin.reason not in FINISH_REASONS:
                metrics.requests.labels(endpoint, "500").inc()
                yield _event({"error": {"message": fin.error or "cancelled", "type": "server_error", "param": None, "code": None}})
                return
            metrics.requests.labels(endpoint, "200").inc()
            yield chunk(None, FINISH_REASONS[fin.reason])
            if include_usage:
                yield _event({"id": rid, "object": kind, "created": created, "model": model_id, "choices": [],
                              "usage": _usage(fin), "timings": _timings(fin)})
            yield "data: [DONE]\n\n"
            return
    finally:
        watcher.cancel()
        if not finished:
            scheduler.cancel(job)  # the client went away mid-stream (or the server is stopping)


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


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
