"""OpenAI's chat, completions and embeddings endpoints (/v1): the body read and translated (serve.dialects.openai),
the model held, the answer started, and written back whole or as server-sent events."""

from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..asked import Asked
from ..dialects import openai
from ..endpoint import (answered_by, also, answering, counted_events, embeddings_of, endpoint, fingerprint, holding, named,
                        off_loop_if_big, read_body, streamed, whole)
from ..errors import PromptFailed, is_refusal
from ..prepare import rendered


@endpoint("/v1/chat/completions", openai)
async def chat_completions(request: Request):
    raw = await read_body(request)
    body = await off_loop_if_big(len(raw), openai.parse_body, raw, openai.ChatBody)  # a large body off the event loop
    named(request, body.model)  # in the log line also when it fails from here on
    return await _completion(request, openai.chat_asked(body), chat=True)


@endpoint("/v1/completions", openai)
async def completions(request: Request):
    raw = await read_body(request)
    body = await off_loop_if_big(len(raw), openai.parse_body, raw, openai.CompletionBody)
    named(request, body.model)
    return await _completion(request, openai.completion_asked(body), chat=False)


async def _completion(request: Request, asked: Asked, chat: bool):
    if asked.reply.n > 1:
        return await _choices(request, asked, chat)
    async with holding(request, asked) as held:
        answer = await answering(request, held, asked)
    rid, model_id = openai.new_id(chat), answered_by(request, asked, held.resident)  # the name the client used, as OpenAI echoes it
    top_logprobs, made_by = answer.request.top_logprobs, fingerprint()
    if asked.reply.stream:
        wire = openai.sse(counted_events(request, answer), rid, chat, asked.reply.usage, model_id, held.facts, top_logprobs,
                          progress=asked.reply.progress, fingerprint=made_by)
        return streamed(request, answer, wire)
    text, final = await whole(request, answer)
    logprobs = openai.logprobs_of(held.facts, chat, final.logprobs) if top_logprobs is not None else None
    return JSONResponse(openai.completion(rid, chat, model_id, text, final, logprobs, answer.read_whole, made_by))


async def _choices(request: Request, asked: Asked, chat: bool):
    """`n` choices, each its own request (a fixed seed counts up, so the choices differ), decoded side by side in
    the model's slots and answered together."""
    seed, answers, facts = asked.sampling.get("seed"), [], []
    try:
        for i in range(asked.reply.n):
            one = replace(asked, reply=replace(asked.reply, n=1),
                          sampling={**asked.sampling, **({"seed": seed + i} if seed is not None else {})})
            async with holding(request, one) as held:
                answers.append(await answering(request, held, one))
            facts.append(held.facts)
        results = [(answer, *await whole(request, answer)) for answer in answers]
    except Exception:
        for answer in answers:
            answer.cancel()
        raise
    replies = [openai.completion("", chat, answered_by(request, asked, answer.resident), text, final,
                                 openai.logprobs_of(of, chat, final.logprobs) if answer.request.top_logprobs is not None else None,
                                 answer.read_whole, fingerprint())
               for (answer, text, final), of in zip(results, facts)]
    return JSONResponse(openai.merged(replies, openai.new_id(chat)))


@endpoint("/v1/embeddings", openai)
async def embeddings(request: Request):
    body = openai.parse_body(await read_body(request), openai.EmbeddingsBody)
    texts = openai.embedding_inputs(body)
    # as OpenAI's: a text over the context is a 400, never cut
    name, result, _ = await embeddings_of(request, openai.embeddings_asked(body), texts, truncate=False, dimensions=body.dimensions)
    return JSONResponse(openai.embeddings_answer(name, result, body.encoding_format))


@endpoint("/apply-template", openai)
async def apply_template(request: Request):
    """llama-server's /apply-template: a chat body's prompt, its model's template rendered as the request would be
    answered, without an answer ({"prompt"}); add_generation_prompt false leaves the assistant's turn unopened."""
    raw = await read_body(request)
    body, opened = await off_loop_if_big(len(raw), openai.template_body, raw)
    named(request, body.model)
    asked = openai.chat_asked(body)
    async with holding(request, asked) as held:
        try:
            prompt = await off_loop_if_big(len(raw), rendered, asked, held.facts, opened)
        except Exception as exc:  # noqa: BLE001 - a template raising on these messages is the request's fault
            raise exc if is_refusal(exc) else PromptFailed(exc) from None
    return JSONResponse({"prompt": prompt})


# llama-server's unprefixed paths of the same (its /completions is its own native completion: serve/routes/llama.py)
ROUTES = [chat_completions, completions, embeddings, apply_template, also(chat_completions, "/chat/completions"),
          also(embeddings, "/embeddings")]
