"""One dialect-neutral answer stream: what a scheduler job produces, as events a dialect writes in its own
wire format (Anthropic's content blocks, the Responses API's output items): thinking, text, tool calls
(found in the model's own format as the text streams, engine.tools.CallStream), a ping while nothing comes
(a long prompt is still being evaluated: clients that give up on a silent connection stay), and the end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional

from ..runtime import Response
from ..runtime.scheduler import Job
from .openai import FINISH_REASONS, PING_S, ApiError, next_piece


@dataclass
class Event:
    kind: str  # "thinking", "text", "tool_calls", "ping", "done" (final set), "failed" (final set, error)
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    final: Optional[Response] = None


async def answer_events(job: Job, ping_s: float = PING_S) -> AsyncIterator[Event]:
    """The job's answer as events, ending with "done" or "failed"."""
    calls_stream = job.tools.stream() if job.tools is not None else None
    while True:
        try:
            response, text, thought, _ = await asyncio.wait_for(next_piece(job), ping_s)
        except asyncio.TimeoutError:  # queue.get is cancelled before it takes anything: no piece is lost
            yield Event("ping")
            continue
        ended_well = response.done and response.finish_reason in FINISH_REASONS
        if response.done and not ended_well:
            yield Event("failed", text=response.error or "the request was cancelled", final=response)
            return
        if thought:
            yield Event("thinking", thought)
        calls: list[dict] = []
        if calls_stream is not None:
            text = calls_stream.feed(text)
            if ended_well:
                rest, calls = job.tools.settle(calls_stream)
                text += rest
        if text:
            yield Event("text", text)
        if calls:
            yield Event("tool_calls", calls=calls)
        if response.done:
            yield Event("done", final=response)
            return


def sse(name: Optional[str], data: dict) -> str:
    """One server-sent event (`event: NAME` where the dialect names its events)."""
    import json

    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


# -- what the translators (anthropic.py, responses.py) share --------------------------------------------


def need(cond: bool, message: str, param: Optional[str] = None) -> None:
    """A 400 naming what is wrong with the body, unless `cond`."""
    if not cond:
        raise ApiError(400, message, param=param)


def function_tools(tools: Any, runs_here, schema_key: str) -> list[dict]:
    """A dialect's tools as OpenAI function tools: those `runs_here(tool)` says are the client's own
    functions; the rest (web_search and other tools the dialect's own service runs) are left out, as
    nothing here can run them."""
    if tools is None:
        return []
    need(isinstance(tools, list), "tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        need(isinstance(t, dict), f"tools.{i} must be an object", "tools")
        if not runs_here(t):
            continue
        need(isinstance(t.get("name"), str) and t["name"], f"tools.{i}.name must be a non-empty string", "tools")
        schema = t.get(schema_key) or {"type": "object", "properties": {}}
        need(isinstance(schema, dict), f"tools.{i}.{schema_key} must be a JSON schema object", "tools")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description") or "", "parameters": schema}})
    return out
