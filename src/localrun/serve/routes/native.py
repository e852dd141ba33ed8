"""localrun's own dialect, spoken by `localrun run` and `chat` to the resident server (serve.dialects.native): POST /api/run
and /api/converse stream what runtime.serving.resident's request paths give (the ones in-process runs take) as JSON Lines,
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
from ...runtime.client.identity import build_identity
from ...runtime.serving.resident import answer as answer_run, converse
from ..dialects import native
from ..endpoint import endpoint, service_of, until_gone
from ..stream import ToLoop


@endpoint("/api/version", native, methods=("GET",))
async def version(request: Request):
    return JSONResponse({"version": __version__, "identity": build_identity(), "pid": os.getpid(),
                         "busy": service_of(request).pool.busy()})


@endpoint("/api/run", native)
async def run(request: Request):
    def work(resident, payload, fresh, put, gone) -> None:
        for response in answer_run(resident, payload, fresh=fresh, on_notice=lambda m: put({"notice": m}), cancelled=gone.is_set):
            put(native.line_of(response))

    return await _streamed(request, work)


@endpoint("/api/converse", native)
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


@endpoint("/api/cancel", native)
async def cancel(request: Request):
    try:
        key = json.loads(await request.body())["conversation"]
    except (ValueError, TypeError, KeyError):
        raise native.RunRefused(400, "a cancel request needs conversation", 2) from None
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
        # The client asked for this load and went away during it (Ctrl-C): the load is done, so it stays for its
        # keep-alive (as Ollama keeps it: the next run need not load it again)
        service.pool.release(resident, keep_alive)
        service.activity(-1)
        raise native.RunRefused(499, "the client went away while its model loaded", 130, code="cancelled")
    out, gone = ToLoop(), threading.Event()
    work = lambda: work_on(resident, payload, fresh, out.put, gone)  # noqa: E731
    threading.Thread(target=_answer, args=(service, resident, fresh, keep_alive, work, out), name="localrun-run", daemon=True).start()
    return StreamingResponse(_lines(request, out.queue, gone), media_type="application/x-ndjson")


def _answer(service, resident, fresh: bool, keep_alive, work, out: ToLoop) -> None:
    """On a thread of its own: `work()` answering, its end said ({"end": true}, or the failure in one line, as
    in-process); the model given back however it ends."""
    try:
        notice = facts_of(resident).gpu_notice
        if fresh and notice:
            out.put({"notice": notice})
        work()
        out.put({"end": True})
    except Exception as exc:  # noqa: BLE001 - one line to the client, as in-process; the trace to the log
        if not isinstance(exc, LocalrunError):
            traceback.print_exc()
        out.put(native.failure(exc))
    finally:
        service.pool.release(resident, keep_alive)
        service.activity(-1)
        out.put(None)


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
