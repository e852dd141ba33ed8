"""OpenAI's Responses API (/v1/responses, what Codex and the Responses modes of LangChain and pydantic-ai
speak), as a translator: a Responses body becomes the chat request the OpenAI dialect serves (ChatBody),
and the answer stream becomes output items (reasoning, message, function_call) and the Responses events.

`previous_response_id` continues an earlier response: the last few hundred in memory, whatever `store` says
(a client that sends the id expects it to be found), and those stored (`store` true, its default) on disk
too (store.responses), so that they continue after a restart, their KV state restored from the prefix
cache rather than the conversation evaluated again; tools other than functions
(web_search, namespace, file_search, ...) are left out, as nothing here can run them."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

from .errors import ApiError
from .openai import ChatBody, validation_error
from .stored import STORED, Kept
from .stream import Event, function_tools, need
from .wire import sse

def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    need(isinstance(content, list), f"{where} must be a string or a list of content parts", where)
    parts = []
    for i, part in enumerate(content):
        need(isinstance(part, dict), f"{where}.{i} must be a content part", where)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            need(isinstance(part.get("text"), str), f"{where}.{i}.text must be a string", where)
            parts.append(part["text"])
        elif kind == "input_image":
            raise ApiError(400, f"{where}.{i}: input_image is read in a message's content only", param=where)
        elif kind in ("input_file", "input_audio"):
            raise ApiError(400, f"{where}.{i}: {kind} is not supported by localrun: send text", param=where)
        elif kind == "refusal":
            parts.append(part.get("refusal") or "")
        else:
            raise ApiError(400, f"{where}.{i}: unexpected content part type {kind!r}", param=where)
    return "\n".join(parts)


def _message_content(content: Any, where: str) -> Any:
    """A message's content: its text, or with input_image parts the OpenAI chat parts (images, then the text)."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        return _content_text(content, where)
    images = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            need(isinstance(part.get("image_url"), str),
                 f"{where}.{j}: input_image needs image_url (a data: URL; file_id is not supported by localrun)", f"{where}.{j}")
            images.append({"type": "image_url", "image_url": {"url": part["image_url"]}, "where": f"{where}.{j}"})
    text = _content_text([p for p in content if not (isinstance(p, dict) and p.get("type") == "input_image")], where)
    return [*images, {"type": "text", "text": text}]


def _image_names(messages: list[dict]) -> tuple[list[dict], list[str]]:
    """The messages without the image parts' field names, and those names in order (an image of an earlier
    response's conversation is named by previous_response_id)."""
    names, out = [], []
    for m in messages:
        if isinstance(m.get("content"), list):
            names += [p.get("where", "previous_response_id") for p in m["content"] if p.get("type") == "image_url"]
            m = {**m, "content": [{k: v for k, v in p.items() if k != "where"} for p in m["content"]]}
        out.append(m)
    return out, names


def _input_messages(data: dict, calls: set[str], item_by_id=lambda _: None) -> list[dict]:
    """`instructions` and `input` (a string, or message / function_call / function_call_output items, or an
    item_reference to one of a stored response's, found by `item_by_id`) as OpenAI chat messages. `calls`: the
    call ids of the earlier turns (previous_response_id's); an output must answer one of them or a
    function_call before it, as OpenAI's API requires."""
    given = data.get("input")
    out: list[dict] = []
    pending_thought: list[str] = []  # reasoning items not yet given to the assistant message they precede
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    need(isinstance(given, list), "input must be a string or a list of items", "input")
    for i, item in enumerate(given):
        where = f"input.{i}"
        need(isinstance(item, dict), f"{where} must be an item object", where)
        if item.get("type") == "item_reference":  # the AI SDK's way of sending back an earlier answer (store: true)
            referred = item_by_id(item.get("id")) if isinstance(item.get("id"), str) else None
            need(referred is not None and referred.get("type") != "item_reference",
                 f"{where}: no stored response has an item {item.get('id')!r} (this server keeps the last"
                 f" {STORED} stored responses): send the item itself", where)
            item = referred
        kind = item.get("type", "message")
        if kind == "message":
            need(item.get("role") in ("user", "assistant", "system", "developer"), f"{where}.role must be user, assistant, system or developer", where)
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _message_content(item.get("content"), where + ".content")})
            if role == "assistant" and pending_thought:
                out[-1]["reasoning_content"] = "\n".join(pending_thought)
                pending_thought.clear()
        elif kind == "function_call":
            need(isinstance(item.get("name"), str) and isinstance(item.get("call_id"), str), f"{where}: a function_call needs name and call_id", where)
            calls.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # several calls of one turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                if pending_thought:
                    out[-1]["reasoning_content"] = "\n".join(pending_thought)
                    pending_thought.clear()
        elif kind == "function_call_output":
            need(isinstance(item.get("call_id"), str), f"{where}: a function_call_output needs call_id", where)
            need(item["call_id"] in calls, f"{where}: no function_call with call_id {item['call_id']!r} comes before this"
                 " function_call_output (in input, or in the response previous_response_id names)", where)
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else _content_text(output or [], where + ".output")})
        elif kind == "reasoning":  # an earlier answer's thinking: on the assistant's message it goes with, for the
            thought = _reasoning_text(item)  # template to write back (reasoning models' templates do in a tool loop)
            if thought:
                pending_thought.append(thought)
            continue
        else:
            raise ApiError(400, f"{where}: input items of type {kind!r} are not supported by localrun", param=where)
    return out


def _reasoning_text(item: dict) -> str:
    """A reasoning item's text: its summary's (what localrun's own answers carry), else its content's."""
    parts = [p.get("text") for key in ("summary", "content") for p in item.get(key) or () if isinstance(p, dict)]
    return "\n".join(p for p in parts if isinstance(p, str) and p)


def input_items(data: dict, item_by_id=lambda _: None) -> list[dict]:
    """The request's `input` as the items GET /v1/responses/{id}/input_items lists, in the order given: a
    string is one user message; each item with an id (its own, or one given here) and a status, as OpenAI's.
    Read after chat_body, which has checked them."""
    given = data.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for item in given:
        if item.get("type") == "item_reference":  # listed as the item it names, as OpenAI lists it (chat_body found it)
            item = item_by_id(item.get("id")) or item
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "output_text" if item.get("role") == "assistant" else "input_text", "text": content}]
            out.append({"id": item.get("id") or _item_id("msg"), "type": "message", "role": item.get("role"),
                        "status": item.get("status") or "completed", "content": content})
        else:
            prefix = {"function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}.get(kind, "item")
            out.append({**item, "id": item.get("id") or _item_id(prefix), **({"status": item.get("status") or "completed"}
                                                                               if kind != "reasoning" else {})})
    return out


def item_list(items: list[dict], query) -> dict:
    """A page of input items as OpenAI lists them: `limit` (1-100, default 20), `order` (desc, the default,
    newest first; or asc), `after` (the id of the item the page starts after)."""
    limit, order, after = query.get("limit", "20"), query.get("order", "desc"), query.get("after")
    try:
        limit = int(limit)
    except ValueError:
        limit = 0
    need(1 <= limit <= 100, f"limit must be an integer from 1 to 100 (got {query.get('limit')!r})", "limit")
    need(order in ("asc", "desc"), f"order must be asc or desc (got {order!r})", "order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i["id"] for i in ordered]
        need(after in ids, f"after: no input item {after!r} in this response", "after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


def _tools(tools: Any) -> list[dict]:
    """The Responses API's function tools (flat: name and parameters beside the type)."""
    return function_tools(tools, lambda t: t.get("type") == "function", "parameters")


def chat_body(data: Any, kept: Kept) -> tuple[ChatBody, list[dict]]:
    """(the chat request a Responses body asks for, the conversation so far to keep with its answer)."""
    from pydantic import ValidationError

    need(isinstance(data, dict), "the body must be a JSON object")
    need(not data.get("background"), "background responses are not supported by localrun: leave out background", "background")
    need(data.get("conversation") is None,
         "conversations are not supported by localrun: continue from an earlier response with previous_response_id", "conversation")
    need(data.get("prompt") is None, "prompt templates (prompt.id) live on OpenAI's platform, not here: send the text as input"
                                     " and instructions", "prompt")
    messages = []
    previous = data.get("previous_response_id")
    if previous is not None:
        earlier = kept.get(previous) if isinstance(previous, str) else None
        if earlier is None:
            raise ApiError(404, f"previous response {previous!r} not found: this server keeps its last {kept.size} responses"
                                f" and the last {STORED} stored ones",
                           param="previous_response_id", code="previous_response_not_found")
        messages = [m for m in earlier if m["role"] != "system"]  # this request's instructions replace the old ones
    messages += _input_messages(data, {c["id"] for m in messages for c in m.get("tool_calls") or ()}, kept.item)
    if isinstance(data.get("instructions"), str) and data["instructions"]:
        messages = [{"role": "system", "content": data["instructions"]}, *messages]
    tools = _tools(data.get("tools"))
    body: dict[str, Any] = {"model": data.get("model"), "messages": messages, "stream": data.get("stream", False),
                            **{k: data[k] for k in ("temperature", "top_p", "draft_max") if data.get(k) is not None}}
    if data.get("max_output_tokens") is not None:
        body["max_tokens"] = data["max_output_tokens"]
    choice = data.get("tool_choice")
    need(tools or choice in (None, "auto", "none") or (isinstance(choice, dict) and choice.get("type") != "function"),
         f"tool_choice {choice!r} needs function tools (tools of other types do not run here)", "tool_choice")
    if tools:
        body["tools"] = tools
        if isinstance(choice, dict) and choice.get("type") == "function":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":  # flat, as the Responses API writes it
            allowed = [{"type": "function", "function": {"name": t.get("name")}} for t in choice.get("tools") or []
                       if isinstance(t, dict) and t.get("type") == "function"]  # (those of other types do not run here)
            need(bool(allowed), "tool_choice allowed_tools names no function tool (tools of other types do not run here)", "tool_choice")
            body["tool_choice"] = {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": allowed}}
        elif choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
        if data.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = data["parallel_tool_calls"]
    fmt = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "output", "schema": fmt.get("schema")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    include = data.get("include") if isinstance(data.get("include"), list) else []
    if "message.output_text.logprobs" in include or data.get("top_logprobs") is not None:  # each token's, in the text part
        body["logprobs"], body["top_logprobs"] = True, data.get("top_logprobs") or 0
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):  # to the template; "none": no thinking
        body["reasoning_effort"] = reasoning["effort"]
    body["messages"], names = _image_names(messages)
    try:
        chat = ChatBody.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc, body) from None
    chat._image_names = names
    return chat, body["messages"]


_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def as_written(exc: ApiError) -> ApiError:
    """An error of the chat request a Responses body became, naming the field the Responses client wrote
    (max_output_tokens, not max_tokens; input, not messages)."""
    head = (exc.param or "").split(".")[0]
    if head not in _NAMES:
        return exc
    return ApiError(exc.status, exc.message.replace(f"'{exc.param}'", f"'{_NAMES[head]}'"), param=_NAMES[head],
                    code=exc.code, type_=exc.type)


def error_answer(exc: ApiError, model: Optional[str] = None) -> tuple[int, dict]:
    """OpenAI's error shape, naming the field as the Responses client wrote it."""
    return exc.status, as_written(exc).body()


def _usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": stats.cached_tokens},
            "output_tokens": stats.generated_tokens, "output_tokens_details": {"reasoning_tokens": stats.thinking_tokens},
            "total_tokens": stats.prompt_tokens + stats.generated_tokens}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _reasoning_item(thinking: str, rid: Optional[str] = None) -> dict:
    return {"type": "reasoning", "id": rid or _item_id("rs"), "summary": [{"type": "summary_text", "text": thinking}]}


def _message_item(text: str, mid: Optional[str] = None, status: str = "completed", logprobs: Optional[list] = None) -> dict:
    """An answer's message item: in progress (no content yet), completed, or incomplete (cut at max_output_tokens);
    `logprobs`: its tokens' (asked with include message.output_text.logprobs or top_logprobs)."""
    return {"type": "message", "id": mid or _item_id("msg"), "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]}


def _cut(final) -> bool:
    """Whether the answer ended at max_output_tokens (the response and its message are then incomplete)."""
    return final is not None and final.finish_reason == "length"


def _call_item(call: dict) -> dict:
    return {"type": "function_call", "id": _item_id("fc"), "call_id": call.get("id") or "call_" + uuid.uuid4().hex[:24],
            "name": call["name"], "arguments": call.get("raw") or json.dumps(call["arguments"], ensure_ascii=False), "status": "completed"}


def envelope(rid: str, data: dict, model: str, created: int, status: str, output: list, final=None) -> dict:
    """A Response object: what was asked (echoed as the API does) and, once done, the output and usage."""
    incomplete = {"reason": "max_output_tokens"} if _cut(final) else None
    status = "incomplete" if incomplete else status
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "completed_at": int(time.time()) if status == "completed" else None,
        "output": output, "error": None, "incomplete_details": incomplete, "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"), "metadata": data.get("metadata") or {},
        "parallel_tool_calls": data.get("parallel_tool_calls", True), "previous_response_id": data.get("previous_response_id"),
        "reasoning": data.get("reasoning") or {"effort": None, "summary": None}, "store": data.get("store", True),
        "temperature": data.get("temperature", 1.0), "text": data.get("text") or {"format": {"type": "text"}},
        "tool_choice": data.get("tool_choice", "auto"), "tools": data.get("tools") or [], "top_p": data.get("top_p", 1.0),
        "top_logprobs": data.get("top_logprobs") or 0,
        "truncation": "disabled", "usage": _usage(final.stats) if final is not None else None, "user": data.get("user"),
    }


def answered(messages: list[dict], text: str, calls: list[dict], output: list[dict]) -> list[dict]:
    """The conversation with this answer, to continue from with previous_response_id."""
    tool_calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
                  for item in output if item["type"] == "function_call"]
    thought = "\n".join(_reasoning_text(item) for item in output if item["type"] == "reasoning")
    return [*messages, {"role": "assistant", "content": text, **({"tool_calls": tool_calls} if tool_calls else {}),
                        **({"reasoning_content": thought} if thought else {})}]


def response(rid: str, data: dict, model: str, created: int, text: str, thinking: str, calls: list, final,
             logprobs: Optional[list] = None) -> dict:
    output = ([_reasoning_item(thinking)] if thinking else []) + (
        [_message_item(text, status="incomplete" if _cut(final) else "completed", logprobs=logprobs)] if text or not calls else []) + [
        _call_item(c) for c in calls]
    return envelope(rid, data, model, created, "completed", output, final)


async def ended(wire: AsyncIterator[str], on_end) -> AsyncIterator[str]:
    """`wire` as it is, then `on_end()` however it ends (answered, failed, or its client gone)."""
    try:
        async for line in wire:
            yield line
    finally:
        on_end()


async def events(answer: AsyncIterator[Event], rid: str, data: dict, model: str, created: int, on_output,
                 logprobs_of=None) -> AsyncIterator[str]:
    """The Responses event sequence: response.created and in_progress, each output item added, its deltas
    and done, then response.completed (or response.failed); `created` the time the request came;
    `logprobs_of(entries)`: a text event's tokens as the API's logprobs, where they were asked for."""
    seq = -1  # OpenAI's sequence numbers start at 0
    said_logprobs: list = []  # the message's tokens' logprobs so far
    output: list[dict] = []
    text_parts: list[str] = []
    calls: list[dict] = []
    current: Optional[dict] = None  # the item whose deltas are streaming
    streaming: dict[int, tuple] = {}  # a call's index -> (its function_call item, its output index, its arguments' parts)

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        return sse(kind, {"type": kind, "sequence_number": seq, **fields})

    def close(status: str = "completed") -> list[str]:
        nonlocal current
        if current is None:
            return []
        item, current = current, None
        index = len(output)
        out = []
        if item["type"] == "message":
            text = "".join(item.pop("_parts"))
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": list(said_logprobs)}
            out += [event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                          logprobs=list(said_logprobs)),
                    event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)]
            item = {**item, "status": status, "content": [part]}
        else:
            thinking = "".join(item.pop("_parts"))
            out.append(event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index, summary_index=0, text=thinking))
            item = {**item, "summary": [{"type": "summary_text", "text": thinking}]}
        output.append(item)
        out.append(event("response.output_item.done", output_index=index, item=item))
        return out

    def open_message() -> list[str]:
        """A message item begins (it streams its text from now on): added, with its one text part."""
        nonlocal current
        index = len(output)
        said_logprobs.clear()  # this message's tokens from here on
        current = {**_message_item("", status="in_progress"), "_parts": []}
        return [event("response.output_item.added", output_index=index, item={k: v for k, v in current.items() if k != "_parts"}),
                event("response.content_part.added", item_id=current["id"], output_index=index, content_index=0,
                      part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    yield event("response.created", response=envelope(rid, data, model, created, "in_progress", []))
    yield event("response.in_progress", response=envelope(rid, data, model, created, "in_progress", []))
    finished = False
    try:
        async for ev in answer:
            if ev.kind == "ping":
                yield ": keep-alive\n\n"  # an SSE comment: clients ignore it, the connection stays
            elif ev.kind in ("thinking", "text"):
                kind = "reasoning" if ev.kind == "thinking" else "message"
                if current is None or current["type"] != kind:
                    for line in close():
                        yield line
                    index = len(output)
                    if kind == "message":
                        for line in open_message():
                            yield line
                    else:
                        current = {"type": "reasoning", "id": _item_id("rs"), "summary": [], "_parts": []}
                        yield event("response.output_item.added", output_index=index, item={k: v for k, v in current.items() if k != "_parts"})
                        yield event("response.reasoning_summary_part.added", item_id=current["id"], output_index=index, summary_index=0,
                                    part={"type": "summary_text", "text": ""})
                current["_parts"].append(ev.text)
                index = len(output)
                if kind == "message":
                    text_parts.append(ev.text)
                    these = logprobs_of(ev.logprobs) if logprobs_of is not None and ev.logprobs else []
                    said_logprobs.extend(these)
                    yield event("response.output_text.delta", item_id=current["id"], output_index=index, content_index=0, delta=ev.text,
                                logprobs=these)
                else:
                    yield event("response.reasoning_summary_text.delta", item_id=current["id"], output_index=index, summary_index=0, delta=ev.text)
            elif ev.kind == "call":  # a function_call item begins; its arguments stream as the model writes them
                for line in close():
                    yield line
                index = len(output)
                item = {"type": "function_call", "id": _item_id("fc"), "call_id": ev.id, "name": ev.name, "arguments": "",
                        "status": "in_progress"}
                streaming[ev.index] = (item, index, [ev.text])
                output.append(item)
                yield event("response.output_item.added", output_index=index, item=dict(item))
                if ev.text:
                    yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=ev.text)
            elif ev.kind == "call_args":
                item, index, parts = streaming[ev.index]
                parts.append(ev.text)
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=ev.text)
            elif ev.kind == "tool_calls":
                for i, call in enumerate(ev.calls):
                    item, index, _ = streaming[i]
                    item.update(arguments=call["raw"], status="completed")
                    calls.append(call)
                    yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"])
                    yield event("response.output_item.done", output_index=index, item=dict(item))
            elif ev.kind == "failed":
                failed = envelope(rid, data, model, created, "failed", output)
                failed["error"] = {"code": "server_error", "message": ev.text}
                finished = True
                yield event("response.failed", response=failed)
                return
            elif ev.kind == "done":
                status = "incomplete" if _cut(ev.final) else "completed"
                for line in close(status):
                    yield line
                if not output:  # an empty answer is still one (empty) message, its text part announced and done as any
                    for line in [*open_message(), *close(status)]:
                        yield line
                completed = envelope(rid, data, model, created, "completed", output, ev.final)
                finished = True
                on_output("".join(text_parts), output, completed)
                # cut at max_output_tokens: OpenAI's stream ends with response.incomplete, not response.completed
                yield event(f"response.{completed['status']}", response=completed)
                return
    finally:
        if not finished:  # the client went away mid-answer: kept as cancelled, with what it said so far (it was lost:
            close("incomplete")  # a retrieve by id, or previous_response_id, found nothing; found by a helper)
            on_output("".join(text_parts), output, envelope(rid, data, model, created, "cancelled", output))
