"""What is not a dialect's answer: the models a client may name (/v1/models, which OpenAI's and Anthropic's
clients both read), the loaded ones (/api/ps), unloading and stopping (/api/stop), health and Prometheus metrics."""

from __future__ import annotations

import asyncio
import datetime
import json

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response as HttpResponse

from ...errors import ModelNotFound
from ...runtime.serving.pool import model_key, pulled_refs
from ..dialects import ollama, openai, shape_for
from ..endpoint import endpoint, refused, service_of
from ..errors import Refused


@endpoint("/v1/models", openai, methods=("GET",))
async def models(request: Request):
    """The loaded models first (with their slots), then the pulled ones a request may name: OpenAI's list, which
    Anthropic's clients read too (each entry and the page carry Anthropic's fields as well)."""
    data = await _listed(request)
    return JSONResponse({"object": "list", "data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})


@endpoint("/v1/models/{model_id:path}", openai, methods=("GET",))
async def model(request: Request):
    """One model of /v1/models by its id (openai's and anthropic's models.retrieve); 404 otherwise, in the shape of
    the client's dialect."""
    wanted = request.path_params["model_id"]
    found = next((m for m in await _listed(request) if m["id"] == wanted), None)
    if found is None:
        missing = Refused(f"the model {wanted!r} does not exist: see /v1/models", "model", status=404, code="model_not_found")
        return refused(missing, shape_for(request.url.path, request.headers))
    return JSONResponse(found)


async def _listed(request: Request) -> list[dict]:
    service = service_of(request)
    pool, data, seen = service.pool, [], set()
    for r in pool.ps():
        seen.add(r["name"].casefold())
        data.append(_entry(service, r["name"], loaded=True, file=r["path"], n_ctx_slot=r["context_length"], slots=r["slots"]))
    held = {name for r in list(pool.residents) for name in r.names}  # every name a loaded model answers to
    refs = await run_in_threadpool(pulled_refs)
    if service.served_unloaded() and service.served_name.casefold() not in seen:  # ejected, still served
        if service.served.casefold() not in {ref.casefold() for ref, _ in refs}:
            seen.add(service.served_name.casefold())
            data.append(_entry(service, service.served_name, loaded=False, file=service.served))
    for ref, path in refs:
        if ref.casefold() not in held and ref.casefold() not in seen:
            data.append(_entry(service, ref, loaded=False, file=path))
    # Anthropic's model fields beside OpenAI's (anthropic's models.list/retrieve read type, display_name, created_at)
    created_at = datetime.datetime.fromtimestamp(service.created, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return [{**m, "type": "model", "display_name": m["id"], "created_at": created_at} for m in data]


def _entry(service, name: str, *, loaded: bool, file, **meta) -> dict:
    # the served model's entry lists its --alias names (sorted, as llama-server's set), the first its id
    aliases = {"aliases": sorted(set(service.options.aliases))} if service.alias and name == service.alias else {}
    return {"id": name, **aliases, "object": "model", "created": service.created, "owned_by": "localrun",
            "meta": {**meta, "file": file, "loaded": loaded}}


@endpoint("/api/ps", ollama, methods=("GET",))
async def ps(request: Request):
    return JSONResponse({"models": [ollama.listed(m) for m in service_of(request).pool.ps()]})


@endpoint("/api/stop", openai)
async def stop(request: Request):
    """Unload one model ({"model": NAME}), every model ({"all": true}), or end the server ({"server": true})."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    asks = [k for k in ("server", "all") if isinstance(body, dict) and body.get(k) is True]
    named = isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]
    if len(asks) + bool(named) != 1:
        raise Refused('send one of {"model": NAME}, {"all": true} or {"server": true}')
    service = service_of(request)
    if asks == ["server"]:
        return _stop_server(service, if_idle=bool(body.get("if_idle")))
    try:  # {"model": NAME, "deleted": true}: NAME was deleted (`localrun rm`), not unloaded by any other name
        chosen = service.deleted(named) if named and body.get("deleted") is True else service.pool.stop(None if asks else named)
    except ModelNotFound as exc:
        raise Refused(exc.message + ": see /api/ps", "model", status=404, code="model_not_found") from None
    # "busy": still answering, unloaded when those requests end
    return JSONResponse({"stopped": [name for name, _ in chosen], "busy": [name for name, busy in chosen if busy]})


def _stop_server(service, if_idle: bool) -> JSONResponse:
    if if_idle and not service.end_if_idle():
        raise Refused("the server is answering requests", status=409, code="busy")
    stopped = [r["name"] for r in service.pool.ps()]
    answering = sum(r.refs for r in list(service.pool.residents))  # ended with the server (said by `stop --server`)
    asyncio.get_running_loop().call_soon(service.end)
    return JSONResponse({"stopped": stopped, "busy": [], "server": True, "answering": answering})


async def health(request: Request):
    residents = list(service_of(request).pool.residents)
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
    return HttpResponse(service_of(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTES = [models, model, ps, stop]
