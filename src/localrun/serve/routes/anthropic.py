"""Anthropic's Messages API (/v1/messages and its count_tokens): the body translated (serve.dialects.anthropic),
answered on the request path every dialect takes, written as a Messages response or Anthropic's events."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..dialects import anthropic
from ..endpoint import answered_by, answering, counted_events, endpoint, holding, named, read_json, streamed, whole
from ..prepare import prompt_length


@endpoint("/v1/messages", anthropic)
async def messages(request: Request):
    asked = anthropic.asked_of(await read_json(request))
    named(request, asked.model)
    async with holding(request, asked) as held:
        answer = await answering(request, held, asked)
    model = answered_by(request, asked, held.resident)
    if asked.reply.stream:
        return streamed(request, answer, anthropic.events(counted_events(request, answer), model, answer.prompt_tokens, asked.stops))
    text, final = await whole(request, answer)
    content, calls = answer.read_whole(text)
    return JSONResponse(anthropic.message(model, content or "", final.thinking, calls, final, asked.stops))


@endpoint("/v1/messages/count_tokens", anthropic)
async def count_tokens(request: Request):
    """How many tokens the prompt of a Messages body is, translated as for an answer."""
    data = await read_json(request)
    asked = anthropic.asked_of({**data, "max_tokens": 1, "stream": False} if isinstance(data, dict) else data)
    async with holding(request, asked) as held:
        tokens = await run_in_threadpool(prompt_length, asked, held.facts)
    return JSONResponse({"input_tokens": tokens})


ROUTES = [messages, count_tokens]
