"""`localrun serve`: the HTTP server over the continuous-batching scheduler.

Starlette routes on uvicorn's event loop; the scheduler thread (runtime/scheduler.py) owns llama.cpp. A
handler validates the body (400 in the dialect's error shape on anything malformed), its dialect's
translator makes it a runtime Request, and the request path `run` and `chat` take answers it
(serve.stream.Answer: runtime.generate on a slot of the model, with the prefix cache on disk); the answer
comes back as one stream of events that each dialect writes in its own wire format. A client that
disconnects stops its answer at once, which frees its slot at the next step. A full waiting queue answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import ContextOverflow, LocalrunError, ModelNotFound, UnknownModel, UsageError
from ..runtime import Loaded, Response
from ..runtime.options import LoadSpec
from ..runtime.pool import FOREVER, ROOM_WAIT_S, ModelPool, Resident, model_key, parse_keep_alive
from ..runtime.scheduler import Job, Scheduler
from .stream import Answer, answer_events
from . import access, anthropic, native, ollama, openai, responses
from .limits import header_timeout, limit_body, max_body_bytes
from .metrics import Metrics
from .openai import ApiError, ChatBody, CompletionBody


_BIG_BODY = 1 << 20  # bodies over this are parsed on a worker thread


@dataclass
class ServeOptions:
    spec: LoadSpec = field(default_factory=lambda: LoadSpec(parallel=4))  # the server's load-time options (requests may differ)
    max_waiting: int = 64
    prefill_chunk: int = 256
    api_key: Optional[str] = None
    max_body: int = field(default_factory=max_body_bytes)  # bytes; 0: no cap (serve/limits.py)
    model: Optional[str] = None  # the model named on the command line: loaded at start, the default
    sampling: Optional[dict] = None  # the sampling flags given to serve, over each model's catalogue defaults
    keep_alive: float = 300.0
    max_models: int = 0
    memory_budget: Optional[int] = None
    source: str = "auto"
    exit_when_idle: Optional[float] = None  # the resident server: exit after this long with no model loaded
    socket: bool = False  # the resident server: on its Unix socket, speaking localrun's own /api/run too
    quiet: bool = False  # no access log (one line per request on stderr)


class Service:
    """What the routes share: the model pool (each resident model with its scheduler) and the metrics."""

    def __init__(self, options: ServeOptions, on_notice=None):
        self.options = options
        self.created = int(time.time())
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.metrics = Metrics()
        self.pool = ModelPool(
            make_scheduler=self._scheduler, load=self._load, keep_alive=options.keep_alive,
            max_models=options.max_models, memory_budget=options.memory_budget,
            on_notice=on_notice or (lambda message: None),
            # The resident server does not make a run wait for room: its client answers in its own process at once.
            room_wait=0.0 if options.socket else ROOM_WAIT_S,
        )
        self.metrics.watch(self.pool)
        from ..runtime.workers import fail_over_lost_workers

        fail_over_lost_workers(self.pool)  # a lost RPC worker fails its model's requests, not the server
        self.stopping = False
        self.exit = lambda: None  # ends the HTTP server (set by `serve`)
        self.inflight = 0
        self.counting = threading.Lock()
        self.last_activity = time.monotonic()
        # Every name a loaded model answered to -> what loads it again: a name /api/ps or /v1/models listed
        # (a path model's file name) still works after the model unloads (an eject, its keep-alive).
        self.known: dict[str, str] = {}
        self.served: Optional[str] = None  # what loads the command line's model: pinned again when reloaded
        self.served_name: Optional[str] = None  # the name it is listed by, loaded or not (ejected)

    def served_unloaded(self) -> bool:
        """The command line's model is not loaded now (ejected): still listed, as it is still served."""
        return self.served is not None and not any(r.loaded.ref == self.served for r in list(self.pool.residents))

    def remember(self, resident: Resident) -> None:
        for name in list(resident.names):
            self.known[name] = resident.loaded.ref

    def deleted(self, ref: str) -> list[tuple[str, bool]]:
        """Model `ref` was deleted (or replaced by a create or copy of its name): unloaded where it is loaded as
        itself (runtime.pool.deleted), and its names name nothing any more. The pool's (name, still answering)."""
        for name in [n for n, r in self.known.items() if r.casefold() == ref.casefold() or n == ref.casefold()]:
            del self.known[name]
        return self.pool.deleted(ref)

    def resolve(self, name: str) -> str:
        """What a request's model name loads: a loaded model's ref by any of its names, else a name a model
        answered to before it unloaded, else the name as given."""
        wanted = name.casefold()
        loaded = next((r.loaded.ref for r in list(self.pool.residents) if wanted in r.names), None)
        return loaded or self.known.get(wanted, name)

    def activity(self, delta: int) -> None:
        """A run request began (+1) or ended (-1): the resident server is idle only with none in flight."""
        with self.counting:
            self.inflight += delta
            self.last_activity = time.monotonic()

    def end_if_idle(self, after: float = 0.0) -> bool:
        """Start stopping unless a request is in flight (checked with the count held, so none slips in);
        with `after`, only once no model has been loaded nor any request made for that long."""
        with self.counting:
            if self.inflight or self.pool.busy():
                return False
            if after and (self.pool.residents or time.monotonic() - self.last_activity <= after):
                return False
            self.stopping = True
        return True

    def end(self) -> None:
        """Stop serving: open requests end at once, then the HTTP server exits (exit status 0)."""
        self.stopping = True
        self.pool.request_stop()
        self.exit()

    def _load(self, ref: str, spec: LoadSpec):
        from ..runtime.loader import load

        return load(ref, spec, source=self.options.source, sampling=self.options.sampling if spec.kind == "batch" else None)

    def _scheduler(self, loaded: Loaded, slot_ctx: int, spec: LoadSpec):
        if spec.kind == "embed":
            from ..runtime.resident import Exclusive

            return Exclusive()
        # every request waits in its own thread for a slot (a lease: runtime.scheduler.Scheduler.hold)
        scheduler = Scheduler(
            loaded.engine, parallel=spec.parallel, slot_ctx=slot_ctx, max_waiting=self.options.max_waiting,
            prefill_chunk=self.options.prefill_chunk, on_step=self.metrics.step,
            deliver=_deliver, lookup=loaded.decoding.draft_max if loaded.decoding.draft == "lookup" else 0,
        )
        scheduler.start()
        if spec.kind == "batch":  # the HTTP dialects' first request as fast as the next, as llama-server's
            # The end-of-generation tokens that ignore_eos and min_tokens ban: a walk over the vocabulary (0.12 s
            # for gemma's 262k tokens), and a first decode, on the thread that decodes from now on.
            loaded.engine.eog_tokens()
            scheduler.call(loaded.engine.warm_up)
        return scheduler

    def preload(self) -> Resident:
        """The command line's model, loaded before the port opens (a bad one fails `serve` itself)."""
        from ..runtime.pool import pull_if_needed

        pull_if_needed(self.options.model, self.options.source)  # as `serve ALIAS` always did
        resident, _ = self.pool.acquire(self.options.model, self.options.spec, pinned=True)
        self.pool.release(resident, keep_alive=FOREVER)
        self.served, self.served_name = resident.loaded.ref, resident.name
        self.remember(resident)
        return resident



def _deliver(responses: list[tuple[Job, Response]]) -> None:
    """Straight to the jobs' own queues, read by their requests' threads (runtime.scheduler.SlotSeat)."""
    for job, response in responses:
        job.sink.put_nowait(response)


def build_app(service: Service, on_started=None):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response as HttpResponse, StreamingResponse
    from starlette.routing import Route

    pool, metrics = service.pool, service.metrics

    async def read_body(request: Request) -> bytes:
        from starlette.requests import ClientDisconnect

        try:
            return await request.body()
        except ClientDisconnect:  # it went away while sending: nobody reads an answer
            raise ApiError(499, "the client went away before its request was read") from None

    def error_response(exc: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(exc.status)).inc()
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def resident_for(body, kind: str = "batch") -> tuple[Resident, Optional[float], float]:
        """The model the body names (the server's own when it names none), loaded, with a reference taken;
        the request's keep-alive; the seconds its load took (0: it was loaded already)."""
        ref = body.model or service.options.model
        if not ref:
            raise ApiError(400, "no model given and this server was started without one: name one in 'model'", param="model")
        # The id /v1/models and /api/ps list for a model loaded from a path (its file name) names it on
        # every endpoint, whichever kind of context (chat, embeddings) it was loaded for, loaded or not.
        ref = service.resolve(ref)
        keep_alive = None
        if body.keep_alive is not None:
            try:
                keep_alive = parse_keep_alive(body.keep_alive)
            except LocalrunError as exc:
                raise ApiError(400, exc.message, param="keep_alive") from None
        if not service.options.socket and ref.startswith(("/", ".", "~")) and not ref.lower().endswith(".gguf"):
            # Over HTTP a path must at least be a .gguf file: no probing of the server's other files.
            raise ApiError(404, f"model {ref!r} is not a pulled model nor a .gguf file: see /v1/models", param="model",
                           code="model_not_found")
        spec = openai.load_spec(service.options.spec, body.options)
        if kind != spec.kind:
            from dataclasses import replace

            spec = replace(spec, kind=kind, parallel=1)
        if service.stopping:
            raise ApiError(503, "the server is shutting down: retry later", type_="server_error")
        resident = pool.take(ref, spec)  # loaded already (most requests): no hop to a worker thread and back
        if resident is not None:
            return resident, keep_alive, 0.0
        try:
            t0 = time.perf_counter()
            # The command line's model, back after an eject: pinned again, as it was. A client that goes away while
            # the load waits for room stops it waiting (nothing is unloaded or loaded for nobody).
            receive, gone = _receive.get(), threading.Event()
            watcher = asyncio.ensure_future(_set_when_gone(receive, gone)) if receive is not None else None
            try:
                resident, fresh = await run_in_threadpool(lambda: pool.acquire(ref, spec, pinned=ref == service.served,
                                                                               cancelled=gone.is_set))
            finally:
                if watcher is not None:
                    watcher.cancel()
            service.remember(resident)
            return resident, keep_alive, (time.perf_counter() - t0) if fresh else 0.0
        except LocalrunError as exc:  # e.g. a file that would not load: this request fails, the server goes on
            status, message, code = native.load_failure(exc, ref)
            if isinstance(exc, UnknownModel):  # worded for an HTTP client, not the command line
                message = f"unknown model '{exc.name}': {exc.guess}GET /v1/models lists the models this server has"
            raise ApiError(status, message, param="options" if code == "invalid_options" else "model", code=code,
                           type_="server_error" if status >= 500 else "invalid_request_error") from None

    async def answer_for(request: Request, resident: Resident, keep_alive: Optional[float], body,
                         more_context: str = "restart the server with a larger --ctx", name_of=str) -> Answer:
        """The body's request (its dialect's translator made it ChatBody or CompletionBody) answered on
        `resident` through the request path run and chat take (serve.stream.Answer), once it is taken;
        ApiError when it is refused. The reference on the model is given back when the answer ends. A
        large request is translated on a worker thread: other requests go on meanwhile."""
        chat = isinstance(body, ChatBody)
        try:
            size = int(request.headers.get("content-length") or 0)
            wanted, tools = await _off_loop_if_big(size, openai.request_for, resident, body)
        except Exception as exc:  # noqa: BLE001 - the reference is given back whatever went wrong
            pool.release(resident, keep_alive)
            raise openai.refusal(exc, chat, more_context, name_of) from None
        access.note(request, model=body.model or resident.name)

        def on_end(final: Optional[Response]) -> None:  # on the answer's thread, its state saved
            if final is not None and final.stats is not None:
                metrics.finished(final.stats)
            pool.release(resident, keep_alive)

        answer = Answer(resident, wanted, tools=tools, on_end=on_end)
        try:
            await answer.start()
        except BaseException as exc:
            answer.cancel()
            if not isinstance(exc, Exception):
                raise
            raise openai.refusal(exc, chat, more_context, name_of) from None
        if answer.prompt.dropped:
            print(f"notice: the conversation did not fit {resident.name}'s context of {resident.slot_ctx} tokens: its"
                  f" {answer.prompt.dropped} oldest messages were left out ({answer.prompt_tokens} prompt tokens kept)",
                  file=sys.stderr, flush=True)
        return answer

    async def whole(request: Request, answer: Answer) -> tuple[str, Response]:
        """The whole answer (not streamed); the client going away stops it. ApiError when it did not finish."""
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, answer))
        try:
            text, final = await answer.collect()
        except BaseException:
            answer.cancel()  # the handler itself was cancelled (shutdown), or the answer failed: free the slot
            raise
        finally:
            watcher.cancel()
        access.note(request, stats=final.stats)
        return text, final

    async def tracked(request: Request, answer: Answer, endpoint: str):
        """The answer's events, counted as they end (status and tokens) for /metrics and the access log."""
        async for event in answer_events(answer):
            if event.kind in ("done", "failed"):
                metrics.requests.labels(endpoint, "200" if event.kind == "done" else "500").inc()
                if event.final is not None and event.final.stats is not None:
                    access.note(request, stats=event.final.stats)
            yield event

    def streamed(request: Request, answer: Answer, wire, endpoint: str, media_type: str = "text/event-stream") -> StreamingResponse:
        """A streamed answer written by `wire` (a dialect's writer over `tracked` events); a client that goes
        away mid-stream stops the answer (499)."""
        async def body():
            finished = False
            try:
                async for line in wire:
                    yield line
                finished = True
            finally:
                if not finished:
                    answer.cancel()
                    metrics.requests.labels(endpoint, "499").inc()
                    access.note(request, status=499)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"} if media_type == "text/event-stream" else None
        return StreamingResponse(body(), media_type=media_type, headers=headers)

    async def openai_answer(request: Request, kind, endpoint: str):
        try:
            raw = await read_body(request)
            # a large body is parsed off the event loop: other requests (and /health) go on meanwhile
            body = await _off_loop_if_big(len(raw), openai.parse_body, raw, kind)
            access.note(request, model=body.model)  # in the log line also when it fails from here on
            if body.n > 1 and not body.stream:
                return await choices(request, body, endpoint)
            resident, keep_alive, _ = await resident_for(body)
            answer = await answer_for(request, resident, keep_alive, body)
        except ApiError as exc:
            return error_response(exc, endpoint)
        chat = isinstance(body, ChatBody)
        rid = openai.new_id(chat)
        model_id = body.model or resident.name  # the name the client used, as Ollama and OpenAI echo it
        top_logprobs = answer.request.top_logprobs
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            wire = openai.sse(tracked(request, answer, endpoint), rid, chat, include_usage, model_id, resident.engine, top_logprobs,
                              progress=body.return_progress)
            return streamed(request, answer, wire, endpoint)
        try:
            text, final = await whole(request, answer)
        except ApiError as exc:
            return error_response(exc, endpoint)
        metrics.requests.labels(endpoint, "200").inc()
        logprobs = openai.logprobs_of(resident.engine, chat, final.logprobs) if top_logprobs is not None else None
        return JSONResponse(openai.completion(rid, chat, model_id, text, final, logprobs, answer.read_whole))

    kept_responses = responses.Kept()

    async def translated(request: Request, endpoint: str, dialect: str):
        """Anthropic's /v1/messages and OpenAI's /v1/responses: the body translated into the chat request
        /v1/chat/completions serves (one prompt rendering, tools, sampling and request path), the answer
        written in the dialect's own shapes; errors in its own error shape."""
        from .limits import BadJson, parse_json

        def fail(exc: ApiError):
            metrics.requests.labels(endpoint, str(exc.status)).inc()
            headers = {"Retry-After": "1"} if exc.status in (429, 503) else None  # as every dialect's busy answer
            if dialect == "anthropic":
                return JSONResponse(anthropic.error_body(exc), status_code=exc.status, headers=headers)
            return JSONResponse(responses.as_written(exc).body(), status_code=exc.status, headers=headers)

        try:
            raw = await read_body(request)
            try:
                data = await _off_loop_if_big(len(raw), parse_json, raw)
            except BadJson as exc:
                raise ApiError(400, f"malformed JSON body: {exc}") from None
            conversation: list = []
            if dialect == "anthropic":
                body = anthropic.chat_body(data)
            else:
                # off the event loop: a previous response or an item reference may be read from the disk
                body, conversation = await run_in_threadpool(responses.chat_body, data, kept_responses)
            resident, keep_alive, _ = await resident_for(body)
            answer = await answer_for(request, resident, keep_alive, body)
        except ApiError as exc:
            return fail(exc)
        model = body.model or resident.name
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        rid, created = "resp_" + os.urandom(12).hex(), int(time.time())  # one created_at, in progress and done
        stored = dialect == "responses" and data.get("store") is not False
        given = await run_in_threadpool(responses.input_items, data, kept_responses.item) if stored else None
        if stored:  # GET /v1/responses/{id} reads it as in progress until it is answered
            kept_responses.begin(rid, responses.envelope(rid, data, model, created, "in_progress", []), given)

        def keep(text: str, output: list, reply: dict) -> None:
            kept_responses.put(rid, responses.answered(conversation, text, [], output), store=stored, response=reply,
                               input_items=given)

        if not body.stream:
            try:
                try:
                    text, final = await whole(request, answer)
                except ApiError as exc:
                    return fail(exc)
                content, calls = answer.read_whole(text)
                metrics.requests.labels(endpoint, "200").inc()
                if dialect == "anthropic":
                    return JSONResponse(anthropic.message(model, content or "", final.thinking, calls, final, stops))
                asked = answer.request.top_logprobs is not None  # include message.output_text.logprobs, top_logprobs
                logprobs = openai.logprobs_of(resident.engine, True, final.logprobs)["content"] if asked and final.logprobs else None
                reply = responses.response(rid, data, model, created, content or "", final.thinking, calls, final, logprobs)
                keep(content or "", reply["output"], reply)
                return JSONResponse(reply)
            finally:  # kept by keep, or failed (or its client went away): no longer in progress
                kept_responses.end(rid)
        events = tracked(request, answer, endpoint)
        wire = (anthropic.events(events, model, answer.prompt_tokens, stops) if dialect == "anthropic"
                else responses.ended(responses.events(events, rid, data, model, created, keep, logprobs_of=(
                    (lambda entries: openai.logprobs_of(resident.engine, True, entries)["content"])
                    if answer.request.top_logprobs is not None else None)), lambda: kept_responses.end(rid)))
        return streamed(request, answer, wire, endpoint)

    async def messages(request: Request):
        return await translated(request, "/v1/messages", "anthropic")

    async def counted(request: Request, endpoint: str, dialect: str):
        """The prompt a body would be, in tokens, for Anthropic's count_tokens and OpenAI's Responses
        input_tokens (the body as for an answer, translated the same way; errors in the dialect's shape)."""
        from .limits import BadJson, parse_json

        try:
            try:
                raw = await read_body(request)
                data = await _off_loop_if_big(len(raw), parse_json, raw)
            except BadJson as exc:
                raise ApiError(400, f"malformed JSON body: {exc}") from None
            if dialect == "anthropic":
                body = anthropic.chat_body({**data, "max_tokens": 1, "stream": False} if isinstance(data, dict) else data)
            else:
                body, _ = await run_in_threadpool(responses.chat_body, {**data, "stream": False} if isinstance(data, dict) else data,
                                                  kept_responses)
            resident, keep_alive, _ = await resident_for(body)
            try:
                count = await run_in_threadpool(openai.prompt_tokens, resident, body)
            finally:
                pool.release(resident, keep_alive)
        except ApiError as exc:
            metrics.requests.labels(endpoint, str(exc.status)).inc()
            if dialect == "anthropic":
                return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
            return JSONResponse(responses.as_written(exc).body(), status_code=exc.status)
        metrics.requests.labels(endpoint, "200").inc()
        if dialect == "anthropic":
            return JSONResponse({"input_tokens": count})
        return JSONResponse({"object": "response.input_tokens", "input_tokens": count})

    async def count_tokens(request: Request):
        """Anthropic's /v1/messages/count_tokens."""
        return await counted(request, "/v1/messages/count_tokens", "anthropic")

    async def responses_input_tokens(request: Request):
        """OpenAI's POST /v1/responses/input_tokens (the openai SDK's responses.input_tokens.count)."""
        return await counted(request, "/v1/responses/input_tokens", "responses")

    async def responses_create(request: Request):
        return await translated(request, "/v1/responses", "responses")

    def no_response(rid: str, endpoint: str):
        return error_response(ApiError(404, f"Response with id {rid!r} not found: this server keeps the last "
                                            f"{responses.STORED} stored (store: true) responses"), endpoint)

    async def responses_get(request: Request):
        """OpenAI's GET /v1/responses/{id}: a stored response as it was answered (after a restart too), or in
        progress while it is being answered."""
        rid = request.path_params["response_id"]
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            return error_response(ApiError(400, "stream on retrieving a response is for background responses, which localrun does"
                                                " not run: retrieve it without stream", param="stream"), "/v1/responses/{id}")
        found = await run_in_threadpool(kept_responses.envelope, rid)  # from the disk, after a restart
        if found is None:
            return no_response(rid, "/v1/responses/{id}")
        metrics.requests.labels("/v1/responses/{id}", "200").inc()
        return JSONResponse(found)

    async def responses_input_items(request: Request):
        """OpenAI's GET /v1/responses/{id}/input_items: the input items of a stored response, a page at a time."""
        rid = request.path_params["response_id"]
        found = await run_in_threadpool(kept_responses.input_items, rid)
        if found is None:
            return no_response(rid, "/v1/responses/{id}/input_items")
        try:
            page = responses.item_list(found, request.query_params)
        except ApiError as exc:
            return error_response(exc, "/v1/responses/{id}/input_items")
        metrics.requests.labels("/v1/responses/{id}/input_items", "200").inc()
        return JSONResponse(page)

    async def responses_delete(request: Request):
        """OpenAI's DELETE /v1/responses/{id}: a stored response forgotten, in memory and on disk."""
        rid = request.path_params["response_id"]
        if not await run_in_threadpool(kept_responses.delete, rid):
            return no_response(rid, "/v1/responses/{id}")
        metrics.requests.labels("/v1/responses/{id}", "200").inc()
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    async def choices(request: Request, body, endpoint: str):
        """`n` choices, each its own request (a fixed seed counts up, so the choices differ), decoded side by
        side in the model's slots and answered together."""
        answers = []
        try:
            for i in range(body.n):
                one = body.model_copy(update={"n": 1, **({"seed": body.seed + i} if body.seed is not None else {})})
                resident, keep_alive, _ = await resident_for(one)
                answers.append(await answer_for(request, resident, keep_alive, one))
            results = [(answer, *await whole(request, answer)) for answer in answers]
        except ApiError as exc:
            for answer in answers:
                answer.cancel()
            return error_response(exc, endpoint)
        chat = isinstance(body, ChatBody)
        metrics.requests.labels(endpoint, "200").inc()
        replies = [openai.completion("", chat, body.model or answer.resident.name, text, final,
                                     openai.logprobs_of(answer.resident.engine, chat, final.logprobs)
                                     if answer.request.top_logprobs is not None else None, answer.read_whole)
                   for answer, text, final in results]
        return JSONResponse(openai.merged(replies, openai.new_id(chat)))

    async def embeddings_of(body, texts: list, *, truncate: bool = True, dimensions: Optional[int] = None):
        """(the model's name, runtime.embed.Embeddings, seconds its load took) for `texts` on the model the
        body names, loaded as an embeddings context. ApiError for what cannot be done."""
        from ..runtime.resident import embed_on

        resident, keep_alive, load_s = await resident_for(body, kind="embed")
        try:
            result = await run_in_threadpool(embed_on, resident, texts, truncate=truncate, dimensions=dimensions)
        except ContextOverflow as exc:  # a text over the context, truncation off (OpenAI's, or Ollama's truncate: false)
            said = exc.message.split(":")[0]  # "text N is M tokens but the context holds C"
            raise ApiError(400, f"This model's maximum context length is {exc.n_ctx} tokens, but {said}: shorten it", param="input",
                           code="context_length_exceeded") from None
        except LocalrunError as exc:
            raise ApiError(400, exc.message, param="dimensions" if "dimensions" in exc.message else "input") from None
        finally:
            pool.release(resident, keep_alive)
        return body.model or resident.name, result, load_s

    async def v1_embeddings(request: Request):
        try:
            body = openai.parse_body(await read_body(request), openai.EmbeddingsBody)
            texts = openai.embedding_inputs(body)
            name, result, _ = await embeddings_of(body, texts, truncate=False, dimensions=body.dimensions)  # as OpenAI: too long is a 400
        except ApiError as exc:
            return error_response(exc, "/v1/embeddings")
        metrics.requests.labels("/v1/embeddings", "200").inc()
        return JSONResponse(openai.embeddings_answer(name, result, body.encoding_format))

    # -- Ollama's dialect ---------------------------------------------------------------------------

    def ollama_error(exc: ApiError, endpoint: str, model: Optional[str] = None) -> JSONResponse:
        metrics.requests.labels(endpoint, str(exc.status)).inc()
        message, status = exc.message, exc.status
        if exc.code == "model_not_found" and model:  # Ollama's wording, which its clients and users know
            message = f'model "{model}" not found, try pulling it first ({exc.message})'
        if exc.code == "queue_full":  # Ollama's answer when its queue is full: a 503, in its words
            message, status = f"server busy, please try again. maximum pending requests exceeded ({exc.message})", 503
        return JSONResponse({"error": message}, status_code=status, headers={"Retry-After": "1"} if status in (429, 503) else None)

    async def ollama_body(request: Request) -> Any:
        from .limits import BadJson, parse_json

        raw = await read_body(request) or b"{}"
        try:
            return await _off_loop_if_big(len(raw), parse_json, raw)
        except BadJson as exc:
            raise ApiError(400, f"invalid JSON body: {exc}") from None

    async def ollama_answer(request: Request, chat: bool):
        endpoint = "/api/chat" if chat else "/api/generate"
        started = time.perf_counter()
        body = None
        try:
            body, extra = ollama.body_for(await ollama_body(request), chat)
            access.note(request, model=body.model)  # in the log line also when it fails from here on
            resident, keep_alive, load_s = await resident_for(body)
        except ApiError as exc:
            return ollama_error(exc, endpoint, body.model if body is not None else None)
        if extra["empty"]:  # load the model (or with keep_alive 0, unload it): Ollama's preload
            pool.release(resident, keep_alive)
            if keep_alive == 0:
                with contextlib.suppress(ModelNotFound):
                    pool.stop(body.model)  # its embeddings context too: the model goes
            metrics.requests.labels(endpoint, "200").inc()
            return JSONResponse(ollama.loaded(body.model, chat, "unload" if keep_alive == 0 else "load"))
        if extra["think"] not in (None, False):
            from ..runtime import markers_for

            if markers_for(resident.engine.chat_template) is None:  # as Ollama answers for a model that does not think
                pool.release(resident, keep_alive)
                return ollama_error(ApiError(400, f'"{body.model}" does not support thinking'), endpoint)
        if not chat and isinstance(body, ChatBody) and resident.engine.chat_template is None:
            try:
                body = ollama.without_template(body)
            except Exception as exc:  # noqa: BLE001 - the reference on the model is given back whatever failed
                pool.release(resident, keep_alive)
                if isinstance(exc, ApiError):
                    return ollama_error(exc, endpoint)
                raise
        try:
            answer = await answer_for(request, resident, keep_alive, body, name_of=ollama.option_name,
                                      more_context="raise options.num_ctx (or restart the server with a larger --ctx)")
        except ApiError as exc:
            return ollama_error(exc, endpoint)
        model_id = body.model  # the name the client used, as Ollama echoes it
        wants_logprobs = answer.request.top_logprobs is not None
        engine = resident.engine

        def context_of(text: str) -> Optional[list[int]]:
            """generate's `context` (through the template: not raw): the prompt and the answer as tokens, as
            Ollama gives it, for the next request to continue from (tokenized here, as Ollama does)."""
            if "context" not in extra or answer.prompt is None:
                return None
            return [*answer.prompt.tokens, *engine.tokenize(text, add_special=False, parse_special=False)]
        if not extra["stream"]:
            try:
                text, final = await whole(request, answer)
            except ApiError as exc:
                return ollama_error(exc, endpoint)
            metrics.requests.labels(endpoint, "200").inc()
            logprobs = ollama.logprobs_of(resident.engine, final.logprobs) if wants_logprobs else None
            reply = ollama.final(model_id, chat, text, final, started=started, load_s=load_s, logprobs=logprobs,
                                 thinking=final.thinking, context=context_of(text))
            if chat:
                reply["message"] = ollama.with_tool_calls(reply["message"], *answer.read_whole(text))
            return JSONResponse(reply)
        wire = ollama.lines(tracked(request, answer, endpoint), model_id, chat, started=started, load_s=load_s,
                            engine=resident.engine, logprobs=wants_logprobs, context=context_of if "context" in extra else None)
        return streamed(request, answer, wire, endpoint, media_type="application/x-ndjson")

    async def ollama_chat(request: Request):
        return await ollama_answer(request, chat=True)

    async def ollama_completion(request: Request):
        return await ollama_answer(request, chat=False)

    async def ollama_tags(request: Request):
        from ..runtime.report import file_entry, tags_listing

        metrics.requests.labels("/api/tags", "200").inc()
        models = await run_in_threadpool(tags_listing)
        listed = {m["name"] for m in models}
        for r in list(pool.residents):  # loaded from a path: listed too, as the server can answer them
            if r.retiring or r.loaded.ref in listed or r.name in listed:  # (by the name /api/ps and /v1/models list)
                continue  # a model being unloaded (deleted while it answers) is not offered any more
            try:
                models.append(await run_in_threadpool(file_entry, r.name, r.path, r.engine.info))
            except OSError:  # its file is gone (deleted under it): it answers its open requests, nothing new
                continue
            listed.add(r.name)
        if service.served_unloaded() and service.served_name not in listed and service.served not in listed:
            # ejected, still the server's own model
            models.append(await run_in_threadpool(file_entry, service.served_name, service.served))
        return JSONResponse({"models": [ollama.listed(m) for m in models]})

    async def on_named_model(request: Request, action):
        """The model an Ollama body names (`model`, or the older `name`), and what `action(ref)` gives, done off
        the event loop: 404 for a model that is not there, 400 for any other failure. The name is the model's
        own where there is one by it; else what a loaded model answers to by it, as /api/ps or /v1/models list
        it (a path model's file name)."""
        given = ollama.model_named(await ollama_body(request))
        try:
            return given, await making(lambda: action(given))
        except ApiError as exc:
            ref = service.resolve(given)
            if exc.status != 404 or ref == given:
                raise ApiError(exc.status, f"model {given!r} not found") if exc.status == 404 else exc from None
        return ref, await making(lambda: action(ref), missing=f"model {given!r} not found")

    async def ollama_show(request: Request):
        from ..runtime.report import model_card

        try:
            _, card = await on_named_model(request, model_card)
        except ApiError as exc:
            return ollama_error(exc, "/api/show")
        metrics.requests.labels("/api/show", "200").inc()
        return JSONResponse(card)

    async def ollama_delete(request: Request):
        from ..runtime.pool import remove_pulled

        from ..runtime import record_ref

        try:  # the model by that name only: never one a loaded model also answers to (a copy's source)
            given = ollama.model_named(await ollama_body(request))
            ref = await run_in_threadpool(record_ref, given) or given  # as registered (NAME for NAME:latest, an alias's)
            await making(lambda: remove_pulled(given), missing=f"model {given!r} not found")
        except ApiError as exc:
            return ollama_error(exc, "/api/delete")
        service.deleted(ref)  # loaded as itself: unloaded once its requests end; another answering to it too keeps serving
        metrics.requests.labels("/api/delete", "200").inc()
        return JSONResponse({})

    async def making(work, missing: Optional[str] = None):
        """`work()` (a show, a create, a copy) off the event loop; its failure as Ollama answers it: 404 for a
        model that is not there (`missing`, else the failure's own words), 400 for any other."""
        try:
            return await run_in_threadpool(work)
        except ModelNotFound as exc:
            raise ApiError(404, missing or exc.message) from None
        except LocalrunError as exc:
            raise ApiError(400, exc.message) from None

    async def ollama_create(request: Request):
        """Make a model as `localrun create` does, from Ollama's JSON fields or a Modelfile's text; answered as
        Ollama's status objects (streamed unless `stream` is false), a failure in its {"error"} shape."""
        from ..runtime.create import create_model
        from .models import create_request

        notes: list[str] = []
        try:
            name, modelfile, stream = create_request(await ollama_body(request))
            modelfile.base = service.resolve(modelfile.base)  # a name /api/tags or /v1/models lists, as for /api/copy
            made = await making(lambda: create_model(name, modelfile, source=service.options.source, on_notice=notes.append))
        except ApiError as exc:
            return ollama_error(exc, "/api/create")
        for note in notes:
            print(f"warning: /api/create: {note}", file=sys.stderr, flush=True)
        service.deleted(made.name)  # a model of that name loaded before: the new one loads next time
        metrics.requests.labels("/api/create", "200").inc()
        statuses = [*({"status": note} for note in notes), {"status": f"using {made.origin}"}, {"status": "writing manifest"},
                    {"status": "success"}]
        if not stream:
            return JSONResponse({"status": "success"})
        return StreamingResponse(iter([ollama.line(s) for s in statuses]), media_type="application/x-ndjson")

    async def ollama_copy(request: Request):
        from ..runtime.create import copy_model
        from .models import copy_request

        try:
            source, destination = copy_request(await ollama_body(request))
            source = service.resolve(source)  # a name /api/ps or /v1/models lists
            made = await making(lambda: copy_model(source, destination))
        except ApiError as exc:
            return ollama_error(exc, "/api/copy")
        service.deleted(made.name)  # a model of that name loaded before: the copy loads next time
        metrics.requests.labels("/api/copy", "200").inc()
        return HttpResponse(status_code=200)

    async def ollama_pull(request: Request):
        """Pull a model as `localrun pull` does (the Hub, else the PyPI mirror); streamed as Ollama's status
        objects: what is pulled, then "success" (or {"error"})."""
        from ..runtime.pool import pull_if_needed

        try:
            data = await ollama_body(request)
            ref = ollama.model_named(data)
        except ApiError as exc:
            return ollama_error(exc, "/api/pull")
        stream = data.get("stream", True) is not False
        loop = asyncio.get_running_loop()
        progress: asyncio.Queue = asyncio.Queue()
        shown: dict[str, int] = {}

        def on_progress(name: str, total: Optional[int], done: int) -> None:  # on the pulling thread
            step = max(1, (total or 0) // 100)
            if done - shown.get(name, -step) >= step or (total is not None and done >= total):
                shown[name] = done
                loop.call_soon_threadsafe(progress.put_nowait, {"status": f"pulling {name}", "digest": name,
                                                                **({"total": total} if total else {}), "completed": done})

        async def pulled() -> dict:
            try:
                await run_in_threadpool(pull_if_needed, ref, service.options.source, on_progress)
            except LocalrunError as exc:
                metrics.requests.labels("/api/pull", "500").inc()
                return {"error": exc.message}
            metrics.requests.labels("/api/pull", "200").inc()
            return {"status": "success"}

        if not stream:
            result = await pulled()
            return JSONResponse(result, status_code=500 if "error" in result else 200)

        async def lines():
            yield ollama.line({"status": "pulling manifest"})
            task = asyncio.ensure_future(pulled())
            while not task.done() or not progress.empty():
                try:
                    yield ollama.line(await asyncio.wait_for(progress.get(), timeout=0.2))
                except asyncio.TimeoutError:
                    continue
            yield ollama.line(task.result())

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def ollama_embed(request: Request, legacy: bool = False):
        """/api/embed ({"input": text or texts} -> {"embeddings"}), and the older /api/embeddings ({"prompt"} ->
        {"embedding"})."""
        endpoint = "/api/embeddings" if legacy else "/api/embed"
        started = time.perf_counter()
        body = None
        try:
            body, texts, truncate, dimensions = ollama.embed_request(await ollama_body(request), legacy)
            name, result, load_s = await embeddings_of(body, texts, truncate=truncate, dimensions=dimensions)
        except ApiError as exc:
            return ollama_error(exc, endpoint, body.model if body is not None else None)
        metrics.requests.labels(endpoint, "200").inc()
        if legacy:
            return JSONResponse({"embedding": result.vectors[0] if result.vectors else []})
        return JSONResponse({"model": name, "embeddings": result.vectors, "total_duration": int((time.perf_counter() - started) * 1e9),
                             "load_duration": int(load_s * 1e9), "prompt_eval_count": result.prompt_tokens})

    async def ollama_embeddings(request: Request):
        return await ollama_embed(request, legacy=True)

    async def root(request: Request):
        # Ollama's own clients (the `ollama` command) check that the server is up here before each command.
        return HttpResponse("Ollama is running (localrun)", media_type="text/plain")

    async def ollama_version(request: Request):
        from .. import __version__

        return JSONResponse({"version": ollama.OLLAMA_VERSION, "localrun_version": __version__})

    async def completions(request: Request):
        return await openai_answer(request, CompletionBody, "/v1/completions")

    async def chat_completions(request: Request):
        return await openai_answer(request, ChatBody, "/v1/chat/completions")

    async def models(request: Request):
        """The loaded models first (with their slots), then the pulled ones a request may name: OpenAI's list,
        which Anthropic's clients read too (each entry and the page carry Anthropic's fields as well)."""
        metrics.requests.labels("/v1/models", "200").inc()
        data = await listed_models()
        return JSONResponse({"object": "list", "data": data, "has_more": False,
                             "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})

    async def model(request: Request):
        """One model of /v1/models by its id (openai's and anthropic's models.retrieve); 404 otherwise, in the
        shape of the client's dialect."""
        from .limits import speaks_anthropic

        wanted = request.path_params["model_id"]
        found = next((m for m in await listed_models() if m["id"] == wanted), None)
        if found is None:
            missing = ApiError(404, f"the model {wanted!r} does not exist: see /v1/models", param="model", code="model_not_found")
            if speaks_anthropic(request.url.path, request.headers):
                metrics.requests.labels("/v1/models/{id}", "404").inc()
                return JSONResponse(anthropic.error_body(missing), status_code=404)
            return error_response(missing, "/v1/models/{id}")
        metrics.requests.labels("/v1/models/{id}", "200").inc()
        return JSONResponse(found)

    async def listed_models() -> list[dict]:
        from ..runtime.pool import pulled_refs

        data, seen = [], set()
        for r in pool.ps():
            seen.add(r["name"].casefold())
            data.append({"id": r["name"], "object": "model", "created": service.created, "owned_by": "localrun",
                         "meta": {"n_ctx_slot": r["context_length"], "slots": r["slots"], "file": r["path"], "loaded": True}})
        held = {name for r in list(pool.residents) for name in r.names}  # every name a loaded model answers to
        if service.served_unloaded() and service.served_name.casefold() not in seen:  # ejected, still served
            refs = {ref.casefold() for ref, _ in await run_in_threadpool(pulled_refs)}
            if service.served.casefold() not in refs:
                seen.add(service.served_name.casefold())
                data.append({"id": service.served_name, "object": "model", "created": service.created, "owned_by": "localrun",
                             "meta": {"file": service.served, "loaded": False}})
        for ref, path in await run_in_threadpool(pulled_refs):
            if ref.casefold() not in held and ref.casefold() not in seen:
                data.append({"id": ref, "object": "model", "created": service.created, "owned_by": "localrun",
                             "meta": {"file": path, "loaded": False}})
        # Anthropic's model fields beside OpenAI's (anthropic's models.list/retrieve read type, display_name, created_at)
        created_at = datetime.datetime.fromtimestamp(service.created, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        return [{**m, "type": "model", "display_name": m["id"], "created_at": created_at} for m in data]

    async def ps(request: Request):
        return JSONResponse({"models": [ollama.listed(m) for m in pool.ps()]})

    async def stop(request: Request):
        """Unload one model ({"model": NAME}), every model ({"all": true}), or end the server ({"server": true})."""
        body = None
        with contextlib.suppress(ValueError):
            body = json.loads(await request.body() or b"{}")
        asks = [k for k in ("server", "all") if isinstance(body, dict) and body.get(k) is True]
        named = isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]
        if len(asks) + bool(named) != 1:
            return error_response(ApiError(400, 'send one of {"model": NAME}, {"all": true} or {"server": true}'), "/api/stop")
        if asks == ["server"]:
            if body.get("if_idle") and not service.end_if_idle():
                return error_response(ApiError(409, "the server is answering requests", code="busy"), "/api/stop")
            stopped = [r["name"] for r in pool.ps()]
            answering = sum(r.refs for r in list(pool.residents))  # ended with the server (said by `stop --server`)
            asyncio.get_running_loop().call_soon(service.end)
            return JSONResponse({"stopped": stopped, "busy": [], "server": True, "answering": answering})
        try:  # {"model": NAME, "deleted": true}: NAME was deleted (`localrun rm`), not unloaded by any other name
            chosen = service.deleted(named) if named and body.get("deleted") is True else pool.stop(None if asks else named)
        except ModelNotFound as exc:
            return error_response(ApiError(404, exc.message + ": see /api/ps", param="model", code="model_not_found"), "/api/stop")
        # "busy": still answering, unloaded when those requests end
        return JSONResponse({"stopped": [name for name, _ in chosen], "busy": [name for name, busy in chosen if busy]})

    async def health(request: Request):
        residents = list(pool.residents)
        schedulers = [r.scheduler for r in residents]
        fatal = next((s.fatal for s in schedulers if s.fatal), None)
        if fatal:
            return JSONResponse({"status": "error", "error": fatal}, status_code=503)
        slots = sum(len(s.slots) for s in schedulers)
        idle = sum(s.idle_slots() for s in schedulers)
        return JSONResponse({"status": "ok", "slots_idle": idle, "slots_processing": slots - idle,
                             "requests_waiting": sum(s.stats.waiting for s in schedulers),
                             "models": len({model_key(r) for r in residents})})  # a model's embeddings context is the same model

    async def prometheus(request: Request):
        return HttpResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.loop = asyncio.get_running_loop()
        # What the first request would import (anyio's worker threads, tool calls, thinking): imported now.
        await run_in_threadpool(lambda: None)
        from ..runtime import AnswerStream, markers_for, parser_for  # noqa: F401
        await run_in_threadpool(_warm_request_path)
        service.activity(0)  # the idle clock starts when requests can arrive
        if on_started:  # only now: uvicorn handles Ctrl-C from here on, so "Ctrl-C stops" is true once printed
            on_started()
        yield
        from ..runtime.sessions import wait_for_saves
        from .stream import finish_answers

        await run_in_threadpool(finish_answers, 30.0)  # answers still reading their prefix cache chunks off their slot
        await run_in_threadpool(wait_for_saves, 30.0)  # and the chunks handed to the writer, on disk before the process goes

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/v1/embeddings", v1_embeddings, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses_create, methods=["POST"]),
        Route("/v1/responses/input_tokens", responses_input_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses_get, methods=["GET"]),
        Route("/v1/responses/{response_id}/input_items", responses_input_items, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses_delete, methods=["DELETE"]),
        Route("/api/embed", ollama_embed, methods=["POST"]),
        Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/chat", ollama_chat, methods=["POST"]),
        Route("/api/generate", ollama_completion, methods=["POST"]),
        Route("/api/tags", ollama_tags, methods=["GET"]),
        Route("/api/show", ollama_show, methods=["POST"]),
        Route("/api/delete", ollama_delete, methods=["DELETE"]),
        Route("/api/pull", ollama_pull, methods=["POST"]),
        Route("/api/create", ollama_create, methods=["POST"]),
        Route("/api/copy", ollama_copy, methods=["POST"]),
        # the background server's socket answers /api/version with what made it (native), others as Ollama does
        *([] if service.options.socket else [Route("/api/version", ollama_version, methods=["GET"])]),
        Route("/api/stop", stop, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/metrics", prometheus, methods=["GET"]),
        # localrun's own dialect (sessions, any .gguf path) only on the background server's private socket
        *(native.routes(service) if service.options.socket else []),
    ]

    async def http_error(request: Request, exc):
        # 404 for an unknown path and 405 for a wrong method, in the shape of the dialect the path is under
        from .limits import error_body, speaks_anthropic

        what = "no such endpoint" if exc.status_code == 404 else f"{request.method} is not allowed here"
        body = error_body(request.url.path, exc.status_code, f"{what}: {request.url.path}", "invalid_request_error",
                          anthropic=speaks_anthropic(request.url.path, request.headers))
        return HttpResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None), media_type="application/json")

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: http_error, 405: http_error})
    app = _receiving(app)
    app = limit_body(app, service.options.max_body)
    app = _require_key(app, service.options.api_key) if service.options.api_key else app
    return app if service.options.quiet or service.options.socket else access.access_log(app)


def _given_key(headers: dict) -> bytes:
    """The API key a request carries: `Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 has
    it), or Anthropic's `x-api-key: KEY`."""
    scheme, _, token = headers.get(b"authorization", b"").strip().partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return headers.get(b"x-api-key", b"").strip()


def _require_key(app, key: str):
    """ASGI wrapper: every path but /health needs the key, as `Authorization: Bearer KEY` or Anthropic's
    `x-api-key: KEY` (compared in constant time); a 401 in the shape of the dialect the path is under."""
    from .limits import error_body, speaks_anthropic

    expected = key.encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            given = _given_key(headers)
            if not hmac.compare_digest(given, expected):
                path = scope["path"]
                anthropic = speaks_anthropic(path, headers)
                how = "'x-api-key: KEY'" if anthropic else "'Authorization: Bearer KEY'"
                body = error_body(path, 401, f"missing or wrong API key: send {how}", "invalid_request_error",
                                  code="invalid_api_key", anthropic=anthropic)
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


async def _off_loop_if_big(size: int, fn, *args):
    """`fn(*args)` for a request body of `size` bytes: on a worker thread when the body is large (its parse or
    prompt takes long enough to hold up every other request, /health included), else here at once."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args) if size > _BIG_BODY else fn(*args)


def _warm_request_path() -> None:
    """What the first request's path would import and open (runtime.generate, the prefix cache's index,
    migrated if it is new): done before the port opens, so that the first request is as fast as the next."""
    from ..runtime.generate import generate  # noqa: F401
    from ..runtime.sessions import Sessions

    try:
        Sessions.open().close()
    except Exception:  # noqa: BLE001 - a store that cannot open is said by the request that needs it, not here
        pass


_receive: ContextVar = ContextVar("localrun_receive", default=None)  # the request's ASGI receive (resident_for)


def _receiving(app):
    """Each HTTP request's ASGI `receive`, for code that has no Request at hand (a load that waits)."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "http":
            _receive.set(receive)
        await app(scope, receive, send)
    return wrapped


async def _until_gone(receive) -> None:
    """Returns when the client goes away: once the body is read, the next ASGI message says so."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _set_when_gone(receive, gone: threading.Event) -> None:
    await _until_gone(receive)
    gone.set()


async def _cancel_on_disconnect(request, answer: Answer) -> None:
    """The client going away frees the answer's slot at once."""
    await _until_gone(request.receive)
    answer.cancel()


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


def bind_unix(path) -> socket.socket:
    """The resident server's socket, 0600 in its 0700 folder. A socket file nobody answers on (a server
    that died) is replaced; a live one is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        raise LocalrunError(f"a localrun server already listens on {path}: stop it with `localrun stop --server`")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(256)
    return sock


def serve(options: ServeOptions, *, host: str, port: int, socket_path=None, on_ready=None, on_notice=None) -> None:
    """Load the command line's model (if any), bind (TCP, or the resident server's Unix socket), then serve
    until Ctrl-C/SIGTERM, `stop --server`, or (the resident server) an idle spell; in-flight streams get a
    few seconds to finish."""
    import uvicorn

    options.socket = socket_path is not None
    if options.socket:
        from ..runtime.identity import build_identity

        build_identity()  # fixed now, from the environment the server starts with
    service = Service(options, on_notice=on_notice)
    sock, inode = None, None
    interrupted: list[bool] = []
    try:
        resident = service.preload() if options.model else None
        sock = bind_unix(socket_path) if socket_path else bind(host, port)
        bound = None if socket_path else sock.getsockname()[1]
        inode = os.stat(socket_path).st_ino if socket_path else None
        app = build_app(service, on_started=(lambda: on_ready(bound, resident)) if on_ready else None)
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3, lifespan="on",
                                http=header_timeout(AutoHTTPProtocol))

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                # End the open requests first (503 JSON, or an error event on a stream), so that uvicorn's
                # graceful wait sees them finish: past it, uvicorn cancels them and logs a traceback.
                if interrupted and service.pool.stepping():
                    # A second signal while a step is under way (a long prompt's chunk, an image): stop at once.
                    # llama.cpp's step cannot be interrupted and tearing down beside it can crash: every open
                    # answer gets its end now, and the process leaves without waiting (its files are written
                    # whole or not at all).
                    from .stream import end_all

                    end_all("the server was stopped: retry later")
                    print("stopped at once: the step under way was not waited for", file=sys.stderr, flush=True)
                    threading.Timer(0.5, os._exit, args=(130 if sig == signal.SIGINT or any(interrupted) else 0,)).start()
                    return
                if service.pool.busy():
                    print("stopping: the open requests end when the step under way ends (a second Ctrl-C stops at once)",
                          file=sys.stderr, flush=True)
                interrupted.append(sig == signal.SIGINT)
                service.stopping = True
                service.pool.request_stop()
                super().handle_exit(sig, frame)

            async def shutdown(self, sockets=None) -> None:
                # The requests end (503, an error event) when the step under way ends, which for a long prompt's
                # chunk can outlast uvicorn's grace (it would cut them: a plain-text 500, an empty stream):
                # wait for that step first (a second Ctrl-C stops waiting).
                while service.pool.stepping() and not self.force_exit:
                    await asyncio.sleep(0.05)
                await super().shutdown(sockets)

        server = Server(config)
        service.exit = lambda: setattr(server, "should_exit", True)
        if options.exit_when_idle is not None:
            def watch_idle() -> None:
                while not server.should_exit:
                    if service.end_if_idle(after=options.exit_when_idle):
                        service.end()
                    time.sleep(0.25)

            threading.Thread(target=watch_idle, name="localrun-idle", daemon=True).start()
        server.run(sockets=[sock])
    finally:
        if socket_path and inode is not None:  # first, so that the next client starts a server at once
            with contextlib.suppress(OSError):
                if os.stat(socket_path).st_ino == inode:  # not a successor's socket
                    os.unlink(socket_path)
        if sock is not None:
            sock.close()
        service.pool.close()
        from ..runtime.workers import leave_if_workers_lost

        leave_if_workers_lost(130 if any(interrupted) else 0)
    if any(interrupted):
        # uvicorn re-raises the SIGINT it caught, which ends in KeyboardInterrupt (exit 130) unless SIGINT
        # was ignored when we started (a background job of a script): it stopped on Ctrl-C all the same.
        raise KeyboardInterrupt
