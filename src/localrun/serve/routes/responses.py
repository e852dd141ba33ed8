"""OpenAI's Responses API (/v1/responses): a body translated (serve.dialects.responses), answered on the request path every
dialect takes and kept (serve.stored) for previous_response_id and for GET /v1/responses/{id}."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..dialects import responses
from ..endpoint import answered_by, answering, counted_events, endpoint, holding, named, read_json, service_of, streamed, whole
from ..errors import Refused
from ..prepare import prompt_length
from ..stored import STORED


@dataclass
class _Reply:
    """One response being answered: its id, what was asked, the model's name, when it came (one created_at, in
    progress and done), the conversation it continues, and its input items where it is stored (None: not stored)."""

    rid: str
    data: dict
    model: str
    created: int
    conversation: list
    given: Optional[list] = None


@endpoint("/v1/responses", responses)
async def create(request: Request):
    data = await read_json(request)
    asked, conversation = await _translated(request, data)
    named(request, asked.model)
    async with holding(request, asked) as held:
        answer = await answering(request, held, asked)
    stored = service_of(request).stored
    reply = _Reply("resp_" + os.urandom(12).hex(), data, answered_by(request, asked, held.resident), int(time.time()), conversation)
    if data.get("store") is not False:  # GET /v1/responses/{id} reads it as in progress until it is answered
        reply.given = await run_in_threadpool(responses.input_items, data, stored.item)
        stored.begin(reply.rid, responses.envelope(reply.rid, data, reply.model, reply.created, "in_progress", []), reply.given)
    logprobs_of = (lambda entries: responses.logprobs_of(held.facts, entries)) if answer.request.top_logprobs is not None else None
    if asked.reply.stream:
        wire = responses.events(counted_events(request, answer), reply.rid, data, reply.model, reply.created,
                                lambda *kept: _keep(stored, reply, *kept), logprobs_of=logprobs_of)
        return streamed(request, answer, responses.ended(wire, lambda: stored.end(reply.rid)))
    try:  # kept by _keep, or failed (or its client went away): no longer in progress either way
        text, final = await whole(request, answer)
        content, calls = answer.read_whole(text)
        logprobs = logprobs_of(final.logprobs) if logprobs_of is not None and final.logprobs else None
        envelope = responses.response(reply.rid, data, reply.model, reply.created, content or "", final.thinking, calls, final, logprobs)
        _keep(stored, reply, content or "", envelope["output"], envelope)
        return JSONResponse(envelope)
    finally:
        stored.end(reply.rid)


async def _translated(request: Request, data):
    """The request a Responses body asks for, and the conversation it continues; off the event loop: a previous
    response or an item reference may be read from the disk."""
    stored = service_of(request).stored
    return await run_in_threadpool(responses.asked_of, data, stored.get, stored.item, stored.size)


def _keep(stored, reply: _Reply, text: str, output: list, envelope: dict) -> None:
    stored.put(reply.rid, responses.answered(reply.conversation, text, [], output), store=reply.given is not None,
               response=envelope, input_items=reply.given)


@endpoint("/v1/responses/input_tokens", responses)
async def input_tokens(request: Request):
    """OpenAI's POST /v1/responses/input_tokens (the openai SDK's responses.input_tokens.count)."""
    data = await read_json(request)
    asked, _ = await _translated(request, {**data, "stream": False} if isinstance(data, dict) else data)
    async with holding(request, asked) as held:
        tokens = await run_in_threadpool(prompt_length, asked, held.facts)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": tokens})


@endpoint("/v1/responses/{response_id}", responses, methods=("GET",))
async def retrieve(request: Request):
    """A stored response as it was answered (after a restart too), or in progress while it is being answered."""
    rid = request.path_params["response_id"]
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise Refused("stream on retrieving a response is for background responses, which localrun does not run: retrieve"
                      " it without stream", "stream")
    found = await run_in_threadpool(service_of(request).stored.envelope, rid)  # from the disk, after a restart
    if found is None:
        raise _no_response(rid)
    return JSONResponse(found)


@endpoint("/v1/responses/{response_id}/input_items", responses, methods=("GET",))
async def input_items(request: Request):
    """The input items of a stored response, a page at a time."""
    rid = request.path_params["response_id"]
    found = await run_in_threadpool(service_of(request).stored.input_items, rid)
    if found is None:
        raise _no_response(rid)
    return JSONResponse(responses.item_list(found, request.query_params))


@endpoint("/v1/responses/{response_id}", responses, methods=("DELETE",))
async def delete(request: Request):
    """A stored response forgotten, in memory and on disk."""
    rid = request.path_params["response_id"]
    if not await run_in_threadpool(service_of(request).stored.delete, rid):
        raise _no_response(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


def _no_response(rid: str) -> Refused:
    return Refused(f"Response with id {rid!r} not found: this server keeps the last {STORED} stored (store: true) responses",
                   status=404)


ROUTES = [create, input_tokens, retrieve, input_items, delete]
