"""localrun's own dialect, spoken by `localrun run` and `chat` to the resident server: POST /api/run streams
the engine's responses as JSON Lines ({"notice": ...}, a response, or {"error": ..., "exit": N}), ended by
{"end": true}; POST /api/converse does the same for a chat's conversation kept on the server, and
/api/cancel stops a conversation's answer at its next token (the chat's first Ctrl-C; the stream still
ends normally). GET /api/version says what made the server. The request paths are runtime.resident's,
the ones in-process runs take, so stdout, --json and --verbose read the same either way."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import traceback

from ..errors import InvalidModelFile, LocalrunError, ModelNotFound, UsageError
from ..runtime.identity import build_identity
from ..runtime.options import LOAD_FIELDS, LoadSpec
from ..runtime.pool import LoadCancelled, ModelTooBig, PoolBusy, parse_keep_alive
from ..runtime.failures import message_for
from ..runtime.resident import answer, converse, wire
from .stream import ToLoop



def load_failure(exc: LocalrunError, ref: str) -> tuple[int, str, str]:
    """(HTTP status, message, code) for a model the pool could not give: the same table for both dialects."""
    if isinstance(exc, ModelNotFound):
        return 404, exc.message, "model_not_found"
    if isinstance(exc, ModelTooBig):
        return 400, exc.message, "model_too_big"
    if isinstance(exc, PoolBusy):
        return 503, exc.message, "models_busy"
    if isinstance(exc, LoadCancelled):  # nobody reads it: the access log's line
        return 499, exc.message, "cancelled"
    if isinstance(exc, UsageError):
        return 400, exc.message, "invalid_options"
    if isinstance(exc, InvalidModelFile):  # the file named is no model (its message names it): as /api/show says
        return 400, exc.message, "invalid_model_file"
    return 500, f"cannot load {ref}: {exc.message}", "load_failed"


def routes(service) -> list:
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    pool = service.pool

    def failed(status: int, message: str, exit_code: int = 1, **extra) -> JSONResponse:
        return JSONResponse({"error": message, "exit": exit_code, **extra}, status_code=status)

    async def version(request: Request):
        from .. import __version__

        return JSONResponse({"version": __version__, "identity": build_identity(), "pid": os.getpid(), "busy": pool.busy()})

    cancels: set[str] = set()  # conversations whose answer the client asked to stop

    def answer_run(resident, payload, fresh, put, gone) -> None:
        for response in answer(resident, payload, fresh=fresh, on_notice=lambda m: put({"notice": m}), cancelled=gone.is_set):
            put(wire(response))

    def answer_converse(resident, payload, fresh, put, gone) -> None:
        key = payload.get("conversation")
        cancels.discard(key)
        try:
            converse(resident, payload, fresh=fresh, put=put, cancelled=lambda: gone.is_set() or key in cancels, gone=gone.is_set)
        finally:
            cancels.discard(key)

    async def run(request: Request):
        return await stream(request, answer_run)

    async def conversation(request: Request):
        return await stream(request, answer_converse)

    async def cancel(request: Request):
        try:
            key = json.loads(await request.body())["conversation"]
        except (ValueError, TypeError, KeyError):
            return failed(400, "a cancel request needs conversation", 2)
        cancels.add(str(key))
        return JSONResponse({"cancelled": str(key)})

    async def stream(request: Request, work_on):
        try:
            body = json.loads(await request.body())
            ref, payload = str(body["model"]), dict(body["request"])
            load = {k: v for k, v in (body.get("load") or {}).items() if k in LOAD_FIELDS}
        except (ValueError, TypeError, KeyError):
            return failed(400, "a run request needs model, request (and optionally load, keep_alive, identity)", 2)
        if body.get("identity") != build_identity():
            return failed(409, f"this server is {build_identity()}", 1, code="other_build", busy=pool.busy())
        if service.stopping:
            return failed(503, "the server is shutting down: retry", 1, code="stopping")
        try:
            spec = LoadSpec(parallel=service.options.spec.parallel, kind="run", **load)
            spec.check()
            keep_alive = None if body.get("keep_alive") is None else parse_keep_alive(body["keep_alive"])
        except (LocalrunError, TypeError) as exc:
            return failed(400, message_for(exc)[0] if isinstance(exc, LocalrunError) else str(exc), 2)
        service.activity(+1)
        try:
            resident, fresh = await run_in_threadpool(pool.acquire, ref, spec)
        except Exception as exc:  # noqa: BLE001 - any failure to load is this request's, worded as in-process
            service.activity(-1)
            if isinstance(exc, LocalrunError):  # worded as the command line words it (flags)
                status, _, code = load_failure(exc, ref)
                return failed(status, message_for(exc)[0], exc.exit_code, code=code)
            message, exit_code = message_for(exc)
            return failed(500, message, exit_code, code="load_failed")
        if fresh and await request.is_disconnected():
            # The client asked for this load and went away during it (Ctrl-C): nobody will use it, so it is
            # not held for a keep-alive.
            pool.release(resident, 0.0)
            service.activity(-1)
            return failed(499, "the client went away while its model loaded", 130, code="cancelled")
        out = ToLoop()
        put, queue = out.put, out.queue
        gone = threading.Event()

        def work() -> None:
            try:
                if fresh and resident.engine.gpu_notice:
                    put({"notice": resident.engine.gpu_notice})
                work_on(resident, payload, fresh, put, gone)
                put({"end": True})
            except Exception as exc:  # noqa: BLE001 - one line to the client, as in-process; the trace to the log
                if not isinstance(exc, LocalrunError):
                    traceback.print_exc()
                message, exit_code = message_for(exc)
                put({"error": message, "exit": exit_code})
            finally:
                pool.release(resident, keep_alive)
                service.activity(-1)
                put(None)

        threading.Thread(target=work, name="localrun-run", daemon=True).start()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()  # Ctrl-C or a closed pipe on the client: the generation stops at its next token

        watcher = asyncio.ensure_future(watch())

        async def lines():
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield json.dumps(item, ensure_ascii=False) + "\n"
            finally:
                gone.set()
                watcher.cancel()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return [Route("/api/run", run, methods=["POST"]), Route("/api/converse", conversation, methods=["POST"]),
            Route("/api/cancel", cancel, methods=["POST"]), Route("/api/version", version, methods=["GET"])]
