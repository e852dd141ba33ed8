"""OpenAI's chat, completions and embeddings endpoints (/v1): the body read and translated (serve.openai), the model
held, the answer started, and written back whole or as server-sent events."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from .. import openai
from ..endpoint import (answering, counted_events, embeddings_of, endpoint, holding, named, off_loop_if_big, read_body,
                        streamed, whole)
from ..errors import ApiError


@endpoint("/v1/chat/completions", openai.error_answer)
async def chat_completions(request: Request):
    return await _completion(request, openai.ChatBody)


@endpoint("/v1/completions", openai.error_answer)
async def completions(request: Request):
    return await _completion(request, openai.CompletionBody)


async def _completion(request: Request, kind):
    raw = await read_body(request)
    body = await off_loop_if_big(len(raw), openai.parse_body, raw, kind)  # a large body off the event loop
    named(request, body.model)  # in the log line also when it fails from here on
    if body.n > 1 and not body.stream:
        return await _choices(request, body)
    chat = isinstance(body, openai.ChatBody)
    async with holding(request, body) as held:
        answer = await answering(request, held, body, openai.request_for, lambda exc: openai.refusal(exc, chat))
    rid, model_id = openai.new_id(chat), body.model or held.resident.name  # the name the client used, as OpenAI echoes it
    top_logprobs = answer.request.top_logprobs
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        wire = openai.sse(counted_events(request, answer), rid, chat, include_usage, model_id, held.facts, top_logprobs,
                          progress=body.return_progress)
        return streamed(request, answer, wire)
    text, final = await whole(request, answer)
    logprobs = openai.logprobs_of(held.facts, chat, final.logprobs) if top_logprobs is not None else None
    return JSONResponse(openai.completion(rid, chat, model_id, text, final, logprobs, answer.read_whole))


async def _choices(request: Request, body):
    """`n` choices, each its own request (a fixed seed counts up, so the choices differ), decoded side by side in
    the model's slots and answered together."""
    chat, answers, facts = isinstance(body, openai.ChatBody), [], []
    try:
        for i in range(body.n):
            one = body.model_copy(update={"n": 1, **({"seed": body.seed + i} if body.seed is not None else {})})
            async with holding(request, one) as held:
                answers.append(await answering(request, held, one, openai.request_for, lambda exc: openai.refusal(exc, chat)))
            facts.append(held.facts)
        results = [(answer, *await whole(request, answer)) for answer in answers]
    except ApiError:
        for answer in answers:
            answer.cancel()
        raise
    replies = [openai.completion("", chat, body.model or answer.resident.name, text, final,
                                 openai.logprobs_of(of, chat, final.logprobs) if answer.request.top_logprobs is not None else None,
                                 answer.read_whole)
               for (answer, text, final), of in zip(results, facts)]
    return JSONResponse(openai.merged(replies, openai.new_id(chat)))


@endpoint("/v1/embeddings", openai.error_answer)
async def embeddings(request: Request):
    body = openai.parse_body(await read_body(request), openai.EmbeddingsBody)
    texts = openai.embedding_inputs(body)
    # as OpenAI's: a text over the context is a 400, never cut
    name, result, _ = await embeddings_of(request, body, texts, truncate=False, dimensions=body.dimensions)
    return JSONResponse(openai.embeddings_answer(name, result, body.encoding_format))


ROUTES = [chat_completions, completions, embeddings]
