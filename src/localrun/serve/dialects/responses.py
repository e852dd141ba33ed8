"""OpenAI's Responses API (/v1/responses, what Codex and the Responses modes of LangChain and pydantic-ai speak): a
Responses body translated into localrun's request (serve.asked.Asked: `asked_of`), with the conversation it
continues (`previous_response_id`: the earlier turns kept by serve.stored, their images named so); the answer's
events written as output items (reasoning, message, function_call) and the Responses events; its error shape,
naming the fields as a Responses client wrote them (max_output_tokens, input, text.format). Tools other than
functions (web_search, namespace, file_search, ...) are left out, as nothing here can run them. Pure: no HTTP
here (serve/routes/responses.py serves it)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Optional

from ..asked import Asked, Call, Image, Message, Reply, ToolChoice
from ..checks import function_tools, need, options_name, sampling_of, settings, top_logprobs
from ..errors import Refused, Wording, fault
from ..stream import Event
from ..wire import sse

STORED = 1024  # the stored responses a server keeps (serve.stored, store.responses.KEEP)
# localrun's names -> the Responses API's, for the field an error names
_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def name_of(field: str) -> str:
    """A field as a Responses client wrote it (max_output_tokens, not max_tokens; input, not messages)."""
    head = field.split(".")[0]
    return _NAMES[head] if head in _NAMES else options_name(field)


WORDING = Wording(more_context="restart the server with a larger --ctx", name_of=name_of,
                  no_projector="start the server with --mmproj FILE for it, or put its mmproj-*.gguf beside the model file")


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    """OpenAI's error shape, naming the field as the Responses client wrote it."""
    f = fault(exc, WORDING)
    return f.status, {"error": {"message": f.message, "type": f.kind, "param": f.param, "code": f.code}}


# -- a Responses body ------------------------------------------------------------------------------


def asked_of(data: Any, previous: Callable[[str], Optional[list]], item_by_id: Callable[[str], Optional[dict]],
             kept: int = 256) -> tuple[Asked, list[dict]]:
    """(the request a Responses body asks for, the conversation so far to keep with its answer). `previous(id)`: the
    conversation of an earlier response (None: not kept; `kept` are); `item_by_id(id)`: a stored response's item."""
    need(isinstance(data, dict), "the body must be a JSON object")
    need(not data.get("background"), "background responses are not supported by localrun: leave out background", "background")
    need(data.get("conversation") is None,
         "conversations are not supported by localrun: continue from an earlier response with previous_response_id", "conversation")
    need(data.get("prompt") is None, "prompt templates (prompt.id) live on OpenAI's platform, not here: send the text as input"
                                     " and instructions", "prompt")
    conversation = _conversation(data, previous, item_by_id, kept)
    tools = function_tools(data.get("tools"), lambda t: t.get("type") == "function", "parameters")
    parallel = data.get("parallel_tool_calls") if tools else None
    values = settings({"model": data.get("model"), "stream": data.get("stream", False),
                       **{k: data[k] for k in ("temperature", "top_p", "draft_max") if data.get(k) is not None},
                       **({"max_tokens": data["max_output_tokens"]} if data.get("max_output_tokens") is not None else {}),
                       **({"parallel_tool_calls": parallel} if parallel is not None else {}), **_logprobs(data)})
    reasoning = data.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str) else None
    asked = Asked(model=values["model"], messages=_neutral(conversation), tools=tools, effort=effort,
                  choice=_tool_choice(data.get("tool_choice"), tools), parallel_calls=values.get("parallel_tool_calls") is not False,
                  sampling=sampling_of(values), max_tokens=values.get("max_tokens"), draft_max=values.get("draft_max"),
                  top_logprobs=top_logprobs(values["top_logprobs"], "top_logprobs") if "top_logprobs" in values else None,
                  reply=Reply(stream=values["stream"]), **_format(data.get("text")))
    return asked, _unnamed(conversation)


def _conversation(data: dict, previous, item_by_id, kept: int) -> list[dict]:
    """The conversation as the stored responses keep it (OpenAI's chat messages): the earlier response's, this one's
    instructions and input (image parts carrying `where`, the field they came in)."""
    messages = []
    earlier_id = data.get("previous_response_id")
    if earlier_id is not None:
        earlier = previous(earlier_id) if isinstance(earlier_id, str) else None
        if earlier is None:
            raise Refused(f"previous response {earlier_id!r} not found: this server keeps its last {kept} responses and the"
                          f" last {STORED} stored ones", "previous_response_id", status=404, code="previous_response_not_found")
        messages = [m for m in earlier if m["role"] != "system"]  # this request's instructions replace the old ones
    messages += _input_messages(data, {c["id"] for m in messages for c in m.get("tool_calls") or ()}, item_by_id)
    if isinstance(data.get("instructions"), str) and data["instructions"]:
        messages = [{"role": "system", "content": data["instructions"]}, *messages]
    return messages


def _unnamed(messages: list[dict]) -> list[dict]:
    """The messages as they are kept: without their image parts' fields."""
    return [{**m, "content": [{k: v for k, v in p.items() if k != "where"} for p in m["content"]]}
            if isinstance(m.get("content"), list) else m for m in messages]


def _neutral(messages: list[dict]) -> list[Message]:
    """Kept messages as the request's; an image of an earlier response's conversation is named by previous_response_id."""
    out = []
    for m in messages:
        parts = m["content"] if isinstance(m.get("content"), list) else [{"type": "text", "text": m.get("content") or ""}]
        out.append(Message(role=m["role"], text="".join(p["text"] for p in parts if p.get("type") == "text"),
                           images=[Image(p["image_url"]["url"], p.get("where", "previous_response_id")) for p in parts
                                   if p.get("type") == "image_url"],
                           calls=[Call(c["function"]["name"], c["function"]["arguments"], c.get("id"))
                                  for c in m.get("tool_calls") or ()],
                           call_id=m.get("tool_call_id"), thinking=m.get("reasoning_content") or None))
    return out


def _tool_choice(choice: Any, tools: list) -> ToolChoice:
    need(tools or choice in (None, "auto", "none") or (isinstance(choice, dict) and choice.get("type") != "function"),
         f"tool_choice {choice!r} needs function tools (tools of other types do not run here)", "tool_choice")
    if not tools:
        return ToolChoice()
    if isinstance(choice, dict) and choice.get("type") == "function":
        return ToolChoice("function", name=choice.get("name"))
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":  # flat, as the Responses API writes it
        allowed = [t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
        need(bool(allowed), "tool_choice allowed_tools names no function tool (tools of other types do not run here)", "tool_choice")
        return ToolChoice(str(choice.get("mode", "auto")), allowed=tuple(allowed))  # (those of other types do not run here)
    return ToolChoice(choice) if choice in ("auto", "none", "required") else ToolChoice()


def _format(text: Any) -> dict[str, Any]:
    """text.format as the answer's JSON schema or JSON object."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        need(isinstance(fmt.get("schema"), dict), "text.format json_schema needs its schema: {type: json_schema, name, schema: {...}}",
             "text.format")
        return {"json_schema": fmt["schema"]}
    return {"json_object": True} if isinstance(fmt, dict) and fmt.get("type") == "json_object" else {}


def _logprobs(data: dict) -> dict[str, Any]:
    """Each token's logprobs in the text part, asked with include message.output_text.logprobs or top_logprobs."""
    include = data.get("include") if isinstance(data.get("include"), list) else []
    if "message.output_text.logprobs" in include or data.get("top_logprobs") is not None:
        return {"top_logprobs": data.get("top_logprobs") or 0}
    return {}


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
            raise Refused(f"{where}.{i}: input_image is read in a message's content only", where)
        elif kind in ("input_file", "input_audio"):
            raise Refused(f"{where}.{i}: {kind} is not supported by localrun: send text", where)
        elif kind == "refusal":
            parts.append(part.get("refusal") or "")
        else:
            raise Refused(f"{where}.{i}: unexpected content part type {kind!r}", where)
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


def _input_messages(data: dict, calls: set[str], item_by_id) -> list[dict]:
    """`input` (a string, or message / function_call / function_call_output / reasoning items, or an item_reference
    to one of a stored response's, found by `item_by_id`) as OpenAI chat messages. `calls`: the call ids of the
    earlier turns (previous_response_id's); an output must answer one of them or a function_call before it, as
    OpenAI's API requires. A reasoning item goes with the assistant's message after it (for the template to write
    back: reasoning models' templates do in a tool loop)."""
    given = data.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    need(isinstance(given, list), "input must be a string or a list of items", "input")
    out: list[dict] = []
    thoughts: list[str] = []  # reasoning items not yet given to the assistant message they precede
    for i, item in enumerate(given):
        where = f"input.{i}"
        item = _referred(item, where, item_by_id)
        kind = item.get("type", "message")
        if kind == "reasoning":
            thoughts += [_reasoning_text(item)] if _reasoning_text(item) else []
            continue
        if kind not in _INPUT_ITEMS:
            raise Refused(f"{where}: input items of type {kind!r} are not supported by localrun", where)
        before = len(out)
        _INPUT_ITEMS[kind](item, where, out, calls)
        if thoughts and len(out) > before and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = "\n".join(thoughts)
            thoughts.clear()
    return out


def _referred(item: Any, where: str, item_by_id) -> dict:
    """An input item, or the stored item an item_reference names (the AI SDK's way of sending back an earlier
    answer, store: true)."""
    need(isinstance(item, dict), f"{where} must be an item object", where)
    if item.get("type") != "item_reference":
        return item
    referred = item_by_id(item.get("id")) if isinstance(item.get("id"), str) else None
    need(referred is not None and referred.get("type") != "item_reference",
         f"{where}: no stored response has an item {item.get('id')!r} (this server keeps the last {STORED} stored responses):"
         " send the item itself", where)
    return referred


def _input_message(item: dict, where: str, out: list[dict], calls: set[str]) -> None:
    need(item.get("role") in ("user", "assistant", "system", "developer"), f"{where}.role must be user, assistant, system or developer", where)
    role = "system" if item["role"] == "developer" else item["role"]
    out.append({"role": role, "content": _message_content(item.get("content"), where + ".content")})


def _input_call(item: dict, where: str, out: list[dict], calls: set[str]) -> None:
    need(isinstance(item.get("name"), str) and item["name"] and isinstance(item.get("call_id"), str),
         f"{where}: a function_call needs name and call_id", where)
    need(isinstance(item.get("arguments") or "{}", (str, dict)), f"{where}: a function_call's arguments are JSON text", where)
    calls.add(item["call_id"])
    call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
    if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
        out[-1]["tool_calls"].append(call)  # several calls of one turn
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _input_output(item: dict, where: str, out: list[dict], calls: set[str]) -> None:
    need(isinstance(item.get("call_id"), str), f"{where}: a function_call_output needs call_id", where)
    need(item["call_id"] in calls, f"{where}: no function_call with call_id {item['call_id']!r} comes before this"
         " function_call_output (in input, or in the response previous_response_id names)", where)
    output = item.get("output")
    out.append({"role": "tool", "tool_call_id": item["call_id"],
                "content": output if isinstance(output, str) else _content_text(output or [], where + ".output")})


_INPUT_ITEMS = {"message": _input_message, "function_call": _input_call, "function_call_output": _input_output}


def _reasoning_text(item: dict) -> str:
    """A reasoning item's text: its summary's (what localrun's own answers carry), else its content's."""
    parts = [p.get("text") for key in ("summary", "content") for p in item.get(key) or () if isinstance(p, dict)]
    return "\n".join(p for p in parts if isinstance(p, str) and p)


def input_items(data: dict, item_by_id=lambda _: None) -> list[dict]:
    """The request's `input` as the items GET /v1/responses/{id}/input_items lists, in the order given: a
    string is one user message; each item with an id (its own, or one given here) and a status, as OpenAI's.
    Read after asked_of, which has checked them."""
    given = data.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for item in given:
        if item.get("type") == "item_reference":  # listed as the item it names, as OpenAI lists it (asked_of found it)
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



# -- the answer ------------------------------------------------------------------------------------


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


def logprobs_of(facts, entries: list) -> list[dict]:
    """Tokens' logprobs as an output_text part carries them (their text from the model's `facts`), with bytes."""
    def piece(token: int) -> dict:
        raw = facts.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "bytes": list(raw)}

    return [{"token": piece(e.token)["token"], "logprob": e.logprob, "bytes": piece(e.token)["bytes"],
             "top_logprobs": [{"token": p["token"], "logprob": lp, "bytes": p["bytes"]} for p, lp in ((piece(t), lp) for t, lp in e.top)]}
            for e in entries]


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
    `on_output(text, output, envelope)` once it is answered (or its client left: then cancelled);
    `logprobs_of(entries)`: a text event's tokens as the API's logprobs, where they were asked for."""
    writer = _Writer(rid, data, model, created, on_output, logprobs_of)
    yield writer.event("response.created", response=writer.envelope("in_progress"))
    yield writer.event("response.in_progress", response=writer.envelope("in_progress"))
    try:
        async for ev in answer:
            for line in writer.on(ev):
                yield line
            if writer.finished:
                return
    finally:
        if not writer.finished:  # the client went away mid-answer: kept as cancelled, with what it said so far (it was
            writer.close("incomplete")  # lost: a retrieve by id, or previous_response_id, found nothing; found by a helper)
            on_output("".join(writer.text), writer.output, writer.envelope("cancelled"))


class _Writer:
    """One response's events as the answer's come: the items so far (`output`), the one streaming, its sequence."""

    def __init__(self, rid: str, data: dict, model: str, created: int, on_output, logprobs_of) -> None:
        self.rid, self.data, self.model, self.created = rid, data, model, created
        self.on_output, self.logprobs_of = on_output, logprobs_of
        self.seq = -1  # OpenAI's sequence numbers start at 0
        self.said_logprobs: list = []  # the message's tokens' logprobs so far
        self.output: list[dict] = []
        self.text: list[str] = []
        self.current: Optional[dict] = None  # the item whose deltas are streaming
        self.streaming: dict[int, tuple] = {}  # a call's index -> (its function_call item, its output index, its arguments' parts)
        self.finished = False

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse(kind, {"type": kind, "sequence_number": self.seq, **fields})

    def envelope(self, status: str, final=None) -> dict:
        return envelope(self.rid, self.data, self.model, self.created, status, self.output, final)

    def on(self, ev: Event) -> list[str]:
        if ev.kind == "ping":
            return [": keep-alive\n\n"]  # an SSE comment: clients ignore it, the connection stays
        if ev.kind in ("thinking", "text"):
            return self.piece(ev)
        if ev.kind == "call":
            return self.call(ev)
        if ev.kind == "call_args":
            item, index, parts = self.streaming[ev.index]
            parts.append(ev.text)
            return [self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=ev.text)]
        if ev.kind == "tool_calls":
            return self.calls(ev.calls)
        if ev.kind == "failed":
            failed = self.envelope("failed")
            failed["error"] = {"code": "server_error", "message": ev.text}
            self.finished = True
            return [self.event("response.failed", response=failed)]
        if ev.kind == "done":
            return self.done(ev.final)
        return []

    def piece(self, ev: Event) -> list[str]:
        """Thinking or text: its item opened if another was streaming, then its delta."""
        kind = "reasoning" if ev.kind == "thinking" else "message"
        out = []
        if self.current is None or self.current["type"] != kind:
            out += self.close()
            out += self.open_message() if kind == "message" else self.open_reasoning()
        self.current["_parts"].append(ev.text)
        index = len(self.output)
        if kind == "reasoning":
            return out + [self.event("response.reasoning_summary_text.delta", item_id=self.current["id"], output_index=index,
                                     summary_index=0, delta=ev.text)]
        self.text.append(ev.text)
        these = self.logprobs_of(ev.logprobs) if self.logprobs_of is not None and ev.logprobs else []
        self.said_logprobs.extend(these)
        return out + [self.event("response.output_text.delta", item_id=self.current["id"], output_index=index, content_index=0,
                                 delta=ev.text, logprobs=these)]

    def call(self, ev: Event) -> list[str]:
        """A function_call item begins; its arguments stream as the model writes them."""
        out = self.close()
        index = len(self.output)
        item = {"type": "function_call", "id": _item_id("fc"), "call_id": ev.id, "name": ev.name, "arguments": "", "status": "in_progress"}
        self.streaming[ev.index] = (item, index, [ev.text])
        self.output.append(item)
        out.append(self.event("response.output_item.added", output_index=index, item=dict(item)))
        if ev.text:
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=ev.text))
        return out

    def calls(self, calls: list[dict]) -> list[str]:
        """The calls whole: each function_call item done."""
        out = []
        for i, call in enumerate(calls):
            item, index, _ = self.streaming[i]
            item.update(arguments=call["raw"], status="completed")
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"]))
            out.append(self.event("response.output_item.done", output_index=index, item=dict(item)))
        return out

    def done(self, final) -> list[str]:
        status = "incomplete" if _cut(final) else "completed"
        out = self.close(status)
        if not self.output:  # an empty answer is still one (empty) message, its text part announced and done as any
            out += [*self.open_message(), *self.close(status)]
        completed = self.envelope("completed", final)
        self.finished = True
        self.on_output("".join(self.text), self.output, completed)
        # cut at max_output_tokens: OpenAI's stream ends with response.incomplete, not response.completed
        return out + [self.event(f"response.{completed['status']}", response=completed)]

    def open_message(self) -> list[str]:
        """A message item begins (it streams its text from now on): added, with its one text part."""
        index = len(self.output)
        self.said_logprobs.clear()  # this message's tokens from here on
        self.current = {**_message_item("", status="in_progress"), "_parts": []}
        return [self.event("response.output_item.added", output_index=index, item=_shown(self.current)),
                self.event("response.content_part.added", item_id=self.current["id"], output_index=index, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def open_reasoning(self) -> list[str]:
        index = len(self.output)
        self.current = {"type": "reasoning", "id": _item_id("rs"), "summary": [], "_parts": []}
        return [self.event("response.output_item.added", output_index=index, item=_shown(self.current)),
                self.event("response.reasoning_summary_part.added", item_id=self.current["id"], output_index=index, summary_index=0,
                           part={"type": "summary_text", "text": ""})]

    def close(self, status: str = "completed") -> list[str]:
        """The item streaming, done: its text (or thinking) whole, then the item."""
        if self.current is None:
            return []
        item, self.current = self.current, None
        index, out = len(self.output), []
        if item["type"] == "message":
            text = "".join(item.pop("_parts"))
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": list(self.said_logprobs)}
            out += [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                               logprobs=list(self.said_logprobs)),
                    self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)]
            item = {**item, "status": status, "content": [part]}
        else:
            thinking = "".join(item.pop("_parts"))
            out.append(self.event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index, summary_index=0,
                                  text=thinking))
            item = {**item, "summary": [{"type": "summary_text", "text": thinking}]}
        self.output.append(item)
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out


def _shown(item: dict) -> dict:
    return {k: v for k, v in item.items() if k != "_parts"}
