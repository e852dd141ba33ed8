"""localrun's own dialect, spoken by `localrun run` to the resident server: POST /api/run streams the
engine's responses as JSON Lines ({"notice": ...}, a response, or {"error": ..., "exit": N}), and
GET /api/version says what made the server. The request path is runtime.resident's, which is the one a
run in-process takes, so stdout, --json and --verbose read the same either way."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import traceback
from dataclasses import asdict
from typing import Any

from ..errors import LocalrunError, ModelNotFound, UsageError
from ..runtime.identity import build_identity
from ..runtime.pool import LOAD_FIELDS, LoadSpec, ModelTooBig, PoolBusy, parse_keep_alive
from ..runtime.failures import message_for
from ..runtime.resident import answer



def load_failure(exc: LocalrunError, ref: str) -> tuple[int, str, str]:
    """(HTTP status, message, code) for a model the pool could not give: the same table for both dialects."""
    if isinstance(exc, ModelNotFound):
        return 404, exc.message, "model_not_found"
    if isinstance(exc, ModelTooBig):
        return 400, exc.message, "model_too_big"
    if isinstance(exc, PoolBusy):
        return 503, exc.message, "models_busy"
    if isinstance(exc, UsageError):
        return 400, exc.message, "invalid_options"
    return 500, f"cannot load {ref}: {exc.message}", "load_failed"


def wire(response) -> dict[str, Any]:
    out: dict[str, Any] = {"text": response.text, "tokens": response.tokens}
    if response.done:
        out["finish_reason"] = response.finish_reason
        out["stats"] = asdict(response.stats) if response.stats is not None else None
        if response.error:
            out["error_text"] = response.error
    return out


def routes(service) -> list:
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    pool = service.pool

    def failed(status: int, message: str, exit_code: int = 1, **extra) -> JSONResponse:
        return JSONResponse({"error": message, "exit": exit_code, **extra}, status_code=status)

    async def version(request: Request):
        return JSONResponse({"identity": build_identity(), "pid": os.getpid(), "busy": pool.busy()})

    async def run(request: Request):
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
            spec = LoadSpec(parallel=1, kind="run", **load)
            spec.check()
            keep_alive = None if body.get("keep_alive") is None else parse_keep_alive(body["keep_alive"])
        except (LocalrunError, TypeError) as exc:
            return failed(400, getattr(exc, "message", str(exc)), 2)
        service.activity(+1)
        try:
            resident, fresh = await run_in_threadpool(pool.acquire, ref, spec)
        except Exception as exc:  # noqa: BLE001 - any failure to load is this request's, worded as in-process
            service.activity(-1)
            if isinstance(exc, LocalrunError):
                status, _, code = load_failure(exc, ref)
                return failed(status, exc.message, exc.exit_code, code=code)
            message, exit_code = message_for(exc)
            return failed(500, message, exit_code, code="load_failed")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop closed: nobody reads
                pass

        def work() -> None:
            try:
                if fresh and resident.engine.gpu_notice:
                    put({"notice": resident.engine.gpu_notice})
                for response in answer(resident, payload, fresh=fresh, on_notice=lambda m: put({"notice": m}), cancelled=gone.is_set):
                    put(wire(response))
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

    return [Route("/api/run", run, methods=["POST"]), Route("/api/version", version, methods=["GET"])]
