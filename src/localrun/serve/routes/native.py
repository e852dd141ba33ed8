"""localrun's own dialect, spoken by `localrun run` and `chat` to the resident server (serve.native): POST /api/run
and /api/converse stream what runtime.resident's request paths give (the ones in-process runs take) as JSON Lines,
/api/cancel stops a conversation's answer at its next token, GET /api/version says what made the server."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import traceback

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from ... import __version__
from ...errors import LocalrunError
from ...runtime.facts import facts_of
from ...runtime.identity import build_identity
from ...runtime.resident import answer as answer_run, converse
from .. import native
from ..endpoint import endpoint, service_of, until_gone
from ..stream import ToLoop


@endpoint("/api/version", native.error_answer, methods=("GET",))
async def version(request: Request):
    return JSONResponse({"version": __version__, "identity": build_identity(), "pid": os.getpid(),
                         "busy": service_of(request).pool.busy()})


@endpoint("/api/run", native.error_answer)
async def run(request: Request):
    def work(resident, payload, fresh, put, gone) -> None:
        for response in answer_run(resident, payload, fresh=fresh, on_notice=lambda m: put({"notice": m}), cancelled=gone.is_set):
            put(native.wire(response))

    return await _streamed(request, work)


@endpoint("/api/converse", native.error_answer)
async def conversation(request: Request):
    cancels = service_of(request).cancels

    def work(resident, payload, fresh, put, gone) -> None:
        key = payload.get("conversation")
        cancels.discard(key)
        try:
            converse(resident, payload, fresh=fresh, put=put, cancelled=lambda: gone.is_set() or key in cancels, gone=gone.is_set)
        finally:
            cancels.discard(key)

    return await _streamed(request, work)


@endpoint("/api/cancel", native.error_answer)
async def cancel(request: Request):
    try:
        key = json.loads(await request.body())["conversation"]
    except (ValueError, TypeError, KeyError):
        raise native.Refused(400, "a cancel request needs conversation", 2) from None
    service_of(request).cancels.add(str(key))
    return JSONResponse({"cancelled": str(key)})


async def _streamed(request: Request, work_on):
    """A run request: the model loaded (as in-process runs load it), `work_on` answering on a thread of its own,
    what it puts streamed as JSON Lines, ended by {"end": true}; the client going away stops it at its next token."""
    service = service_of(request)
    ref, payload, spec, keep_alive = native.run_request(await request.body(), parallel=service.options.spec.parallel,
                                                        stopping=service.stopping, busy=service.pool.busy)
    service.activity(+1)
    try:
        resident, fresh = await run_in_threadpool(service.pool.acquire, ref, spec)
    except Exception as exc:  # noqa: BLE001 - any failure to load is this request's, worded as in-process
        service.activity(-1)
        raise native.load_failed(exc, ref) from None
    if fresh and await request.is_disconnected():
        # The client asked for this load and went away during it (Ctrl-C): nobody will use it, so it is not
        # held for a keep-alive.
        service.pool.release(resident, 0.0)
        service.activity(-1)
        raise native.Refused(499, "the client went away while its model loaded", 130, code="cancelled")
    out, gone = ToLoop(), threading.Event()

    def work() -> None:
        try:
            if fresh and facts_of(resident).gpu_notice:
                out.put({"notice": facts_of(resident).gpu_notice})
            work_on(resident, payload, fresh, out.put, gone)
            out.put({"end": True})
        except Exception as exc:  # noqa: BLE001 - one line to the client, as in-process; the trace to the log
            if not isinstance(exc, LocalrunError):
                traceback.print_exc()
            out.put(native.failure(exc))
        finally:
            service.pool.release(resident, keep_alive)
            service.activity(-1)
            out.put(None)

    threading.Thread(target=work, name="localrun-run", daemon=True).start()
    return StreamingResponse(_lines(request, out.queue, gone), media_type="application/x-ndjson")


async def _lines(request: Request, queue: asyncio.Queue, gone: threading.Event):
    async def watch() -> None:
        await until_gone(request.receive)
        gone.set()  # Ctrl-C or a closed pipe on the client: the generation stops at its next token

    watcher = asyncio.ensure_future(watch())
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            yield json.dumps(item, ensure_ascii=False) + "\n"
    finally:
        gone.set()
        watcher.cancel()


ROUTES = [version, run, conversation, cancel]
