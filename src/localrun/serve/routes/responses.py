"""OpenAI's Responses API (/v1/responses): a body translated (serve.responses), answered on the request path every
dialect takes and kept (serve.stored) for previous_response_id and for GET /v1/responses/{id}."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from .. import openai, responses
from ..endpoint import answering, counted_events, endpoint, holding, read_json, service_of, streamed, whole
from ..errors import ApiError
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


@endpoint("/v1/responses", responses.error_answer)
async def create(request: Request):
    data = await read_json(request)
    stored = service_of(request).stored
    # off the event loop: a previous response or an item reference may be read from the disk
    body, conversation = await run_in_threadpool(responses.chat_body, data, stored)
    async with holding(request, body) as held:
        answer = await answering(request, held, body, openai.request_for, lambda exc: openai.refusal(exc, True))
    reply = _Reply("resp_" + os.urandom(12).hex(), data, body.model or held.resident.name, int(time.time()), conversation)
    if data.get("store") is not False:  # GET /v1/responses/{id} reads it as in progress until it is answered
        reply.given = await run_in_threadpool(responses.input_items, data, stored.item)
        stored.begin(reply.rid, responses.envelope(reply.rid, data, reply.model, reply.created, "in_progress", []), reply.given)
    logprobs_of = ((lambda entries: openai.logprobs_of(held.facts, True, entries)["content"])
                   if answer.request.top_logprobs is not None else None)
    if body.stream:
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


def _keep(stored, reply: _Reply, text: str, output: list, envelope: dict) -> None:
    stored.put(reply.rid, responses.answered(reply.conversation, text, [], output), store=reply.given is not None,
               response=envelope, input_items=reply.given)


@endpoint("/v1/responses/input_tokens", responses.error_answer)
async def input_tokens(request: Request):
    """OpenAI's POST /v1/responses/input_tokens (the openai SDK's responses.input_tokens.count)."""
    data = await read_json(request)
    body, _ = await run_in_threadpool(responses.chat_body, {**data, "stream": False} if isinstance(data, dict) else data,
                                      service_of(request).stored)
    async with holding(request, body) as held:
        tokens = await run_in_threadpool(openai.prompt_tokens, held.resident, body)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": tokens})


@endpoint("/v1/responses/{response_id}", openai.error_answer, methods=("GET",))
async def retrieve(request: Request):
    """A stored response as it was answered (after a restart too), or in progress while it is being answered."""
    rid = request.path_params["response_id"]
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise ApiError(400, "stream on retrieving a response is for background responses, which localrun does not run:"
                            " retrieve it without stream", param="stream")
    found = await run_in_threadpool(service_of(request).stored.envelope, rid)  # from the disk, after a restart
    if found is None:
        raise _no_response(rid)
    return JSONResponse(found)


@endpoint("/v1/responses/{response_id}/input_items", openai.error_answer, methods=("GET",))
async def input_items(request: Request):
    """The input items of a stored response, a page at a time."""
    rid = request.path_params["response_id"]
    found = await run_in_threadpool(service_of(request).stored.input_items, rid)
    if found is None:
        raise _no_response(rid)
    return JSONResponse(responses.item_list(found, request.query_params))


@endpoint("/v1/responses/{response_id}", openai.error_answer, methods=("DELETE",))
async def delete(request: Request):
    """A stored response forgotten, in memory and on disk."""
    rid = request.path_params["response_id"]
    if not await run_in_threadpool(service_of(request).stored.delete, rid):
        raise _no_response(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


def _no_response(rid: str) -> ApiError:
    return ApiError(404, f"Response with id {rid!r} not found: this server keeps the last {STORED} stored (store: true) responses")


ROUTES = [create, input_tokens, retrieve, input_items, delete]
