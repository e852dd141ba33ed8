"""Anthropic's Messages API (/v1/messages and its count_tokens): the body translated (serve.anthropic), answered on
the request path every dialect takes, written as a Messages response or Anthropic's events."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from .. import anthropic, openai
from ..endpoint import answering, counted_events, endpoint, holding, read_json, streamed, whole


@endpoint("/v1/messages", anthropic.error_answer)
async def messages(request: Request):
    body = anthropic.chat_body(await read_json(request))
    async with holding(request, body) as held:
        answer = await answering(request, held, body, openai.request_for, lambda exc: openai.refusal(exc, True))
    model = body.model or held.resident.name
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if body.stream:
        return streamed(request, answer, anthropic.events(counted_events(request, answer), model, answer.prompt_tokens, stops))
    text, final = await whole(request, answer)
    content, calls = answer.read_whole(text)
    return JSONResponse(anthropic.message(model, content or "", final.thinking, calls, final, stops))


@endpoint("/v1/messages/count_tokens", anthropic.error_answer)
async def count_tokens(request: Request):
    """How many tokens the prompt of a Messages body is, translated as for an answer."""
    data = await read_json(request)
    body = anthropic.chat_body({**data, "max_tokens": 1, "stream": False} if isinstance(data, dict) else data)
    async with holding(request, body) as held:
        tokens = await run_in_threadpool(openai.prompt_tokens, held.resident, body)
    return JSONResponse({"input_tokens": tokens})


ROUTES = [messages, count_tokens]
