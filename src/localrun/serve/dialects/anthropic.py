"""Anthropic's Messages API (/v1/messages, what Claude Code and the `anthropic` SDK speak): a Messages body
translated into localrun's request (serve.asked.Asked: `asked_of`), and the answer's events written as Anthropic's
content blocks and events; its error shape. Pure: no HTTP here (serve/routes/anthropic.py serves it).

What cannot be honoured is refused in Anthropic's error shape naming it (document blocks; an image block
anywhere but a user's message); a user's image blocks (base64) go to the model as images; output_config's
format (structured outputs) is the answer's JSON schema; what only steers Anthropic's own service is accepted and
ignored (cache_control, metadata, the rest of output_config, context_management, service_tier, server tools such
as web_search, which a local model cannot run, and their blocks in a history). Anthropic's client tools (bash,
text_editor) are given to the model in their published input schema, as the client runs them."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

from ..asked import Asked, Call, Image, Message, Reply, Tool, ToolChoice
from ..checks import function_tools, need, options_name, sampling_of, settings, stops_of
from ..errors import Fault, Refused, Wording, fault
from ..stream import Event
from ..wire import sse

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 499: "invalid_request_error", 503: "overloaded_error"}
DEFAULT_MAX_TOKENS = 4096
THREAD_NOT_FOUND = "thread_not_found"
WORDING = Wording(more_context="restart the server with a larger --ctx", name_of=options_name,
                  no_projector="start the server with --mmproj FILE for it, or put its mmproj-*.gguf beside the model file")


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    return error_shape(fault(exc, WORDING))


def error_shape(f: Fault) -> tuple[int, dict]:
    """Anthropic's error shape: {"type": "error", "error": {type (by the status), message}}."""
    error = {"type": ERROR_TYPES.get(f.status, "api_error" if f.status >= 500 else "invalid_request_error"), "message": f.message}
    if f.sizes is not None:  # a prompt over the context, in Anthropic's words (Claude Code compacts its conversation on them)
        prompt, context = f.sizes
        error["message"] = f"prompt is too long: {prompt} tokens > {context} maximum ({f.message})"
    if f.code == THREAD_NOT_FOUND:  # what Anthropic's SDKs read to replay the whole conversation (error.details)
        error["details"] = {"error_code": f.code}
    return f.status, {"type": "error", "error": error}


# -- a Messages body -------------------------------------------------------------------------------


def asked_of(data: Any) -> Asked:
    """The request a Messages body asks for; refused naming what is wrong."""
    need(isinstance(data, dict), "the body must be a JSON object")
    thread = data.get("thread")  # the message-threads beta: nothing is kept here to continue one
    if isinstance(thread, dict) and thread.get("type") == "continue":
        raise Refused(f"message thread of {thread.get('previous_message_id')!r} not found: localrun keeps no threads, send the"
                      " whole conversation (Anthropic's SDKs replay it on this error)", status=404, code=THREAD_NOT_FOUND)
    tools = _tools(data.get("tools"))
    choice, parallel = _tool_choice(data.get("tool_choice"), bool(tools))
    max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
    need(type(max_tokens) is int and max_tokens >= 1, "max_tokens must be a positive integer", "max_tokens")
    think, budget = _thinking(data.get("thinking"))
    values = settings({"model": data.get("model"), "max_tokens": max_tokens, "stream": data.get("stream", False),
                       **{k: data[k] for k in ("temperature", "top_p", "top_k", "draft_max") if data.get(k) is not None},
                       **({"stop": data["stop_sequences"]} if data.get("stop_sequences") else {}),
                       **({"reasoning_budget": budget} if budget is not None else {})})
    config = data.get("output_config") if isinstance(data.get("output_config"), dict) else {}
    effort = config.get("effort")  # Claude Code sends it: to the template, as gpt-oss reads it
    return Asked(model=values["model"], messages=_messages(data), tools=tools, choice=choice, parallel_calls=parallel is not False,
                 sampling=sampling_of(values), stops=stops_of(values.get("stop")), max_tokens=max_tokens,
                 draft_max=values.get("draft_max"), json_schema=_schema(config.get("format") or data.get("output_format")),
                 think=think, effort=("high" if effort == "max" else effort) if effort in ("low", "medium", "high", "max") else None,
                 reply=Reply(stream=values["stream"]))


def _thinking(thinking: Any) -> tuple[Optional[bool], Optional[int]]:
    """(the template's thinking switch, a thinking budget) of `thinking`; adaptive: the model's default."""
    if not isinstance(thinking, dict):
        return None, None
    think = {"enabled": True, "disabled": False}.get(thinking.get("type"))
    budget = thinking.get("budget_tokens") if think else None  # past it, the family's end marker closes the thinking
    if budget is not None:
        need(type(budget) is int and budget >= 0, "thinking.budget_tokens must be a whole number, 0 or more", "thinking.budget_tokens")
    return think, budget


def _schema(fmt: Any) -> Optional[dict]:
    """Structured outputs: output_config.format (and its beta's top-level output_format) as the answer's JSON schema."""
    if fmt is None:
        return None
    need(isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict),
         "output_config.format must be {type: json_schema, schema: {...}}", "output_config.format")
    return fmt["schema"]


def _server_block(kind: str) -> bool:
    """A block of a tool Anthropic's service ran (web search, code execution, MCP): nothing here ran it, nothing
    here reads it again (a conversation begun on Anthropic's API continues here without them)."""
    return kind in ("server_tool_use", "mcp_tool_use", "container_upload") or (kind.endswith("_tool_result") and kind != "tool_result")


def _text_of(content: Any, where: str) -> str:
    """The text of a content given as a string or as blocks (text only: images here are refused by name)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    need(isinstance(content, list), f"{where} must be a string or a list of content blocks", where)
    parts = []
    for i, block in enumerate(content):
        need(isinstance(block, dict) and isinstance(block.get("type"), str), f"{where}.{i} must be a content block with a type", where)
        kind = block["type"]
        if kind == "text":
            need(isinstance(block.get("text"), str), f"{where}.{i}.text must be a string", where)
            parts.append(block["text"])
        elif kind == "image":
            raise Refused(f"{where}.{i}: image blocks are read in a user's message content only", where)
        elif kind == "document":
            raise Refused(f"{where}.{i}: document blocks are not supported by localrun: send text", where)
        elif kind in ("thinking", "redacted_thinking") or _server_block(kind):
            continue  # an earlier answer's thinking, or a server tool's use and result: not read again
        else:
            raise Refused(f"{where}.{i}: unexpected block type {kind!r} here", where)
    return "\n".join(parts)


# Anthropic's client tools: defined by Anthropic, run by the client (which sends only their type and name), so
# the model is given their published input schema; those needing more than text (computer use) are left out.
_BASH = {"type": "object", "properties": {"command": {"type": "string", "description": "The bash command to run"},
                                          "restart": {"type": "boolean", "description": "Restart the bash session instead"}}}
_EDITOR = {"type": "object", "required": ["command", "path"], "properties": {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
    "path": {"type": "string", "description": "Absolute path of the file or directory"},
    "file_text": {"type": "string", "description": "create: the new file's content"},
    "old_str": {"type": "string", "description": "str_replace: the exact text to replace"},
    "new_str": {"type": "string", "description": "str_replace: the text that replaces it; insert: the text to insert"},
    "insert_line": {"type": "integer", "description": "insert: the line after which the text goes"},
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: [first, last] line"}}}
CLIENT_TOOLS = {"bash_": ("Run a command in a bash shell", _BASH),
                "text_editor_": ("View, create and edit files: view, create, str_replace, insert, undo_edit", _EDITOR)}


def _client_tool(tool: dict) -> Optional[dict]:
    """An Anthropic-defined client tool (bash_20250124, text_editor_20250728, ...) as a custom tool."""
    kind = tool.get("type")
    found = next((v for k, v in CLIENT_TOOLS.items() if isinstance(kind, str) and kind.startswith(k)), None)
    if found is None:
        return None
    return {"name": tool.get("name"), "description": found[0], "input_schema": found[1]}


def _tools(tools: Any) -> list[Tool]:
    """Anthropic's custom tools and its client tools (bash, text_editor); its server tools (web_search, ...)
    and computer use are left out."""
    if isinstance(tools, list):
        tools = [(_client_tool(t) or t) if isinstance(t, dict) else t for t in tools]
    return function_tools(tools, lambda t: t.get("type") in (None, "custom"), "input_schema")


def _tool_choice(choice: Any, has_tools: bool) -> tuple[ToolChoice, Optional[bool]]:
    """(the request's tool choice, whether several calls may come: None for the default) of Anthropic's tool_choice."""
    if choice is None:
        return ToolChoice(), None
    need(isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"),
         "tool_choice must be {type: auto|any|tool|none}", "tool_choice")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    kind = choice["type"]
    if not has_tools:  # nothing to call: "auto" and "none" mean no call anyway; "any" and "tool" cannot be kept
        need(kind in ("auto", "none"), f"tool_choice {{type: {kind}}} needs tools (of the client's own: server tools"
                                       " such as web_search do not run here)", "tool_choice")
        return ToolChoice(), None
    if kind == "tool":
        need(isinstance(choice.get("name"), str), "tool_choice {type: tool} needs the tool's name", "tool_choice")
        return ToolChoice("function", name=choice["name"]), parallel
    return ToolChoice({"auto": "auto", "any": "required", "none": "none"}[kind]), parallel


def _image_url(block: dict, where: str) -> str:
    """An image block's source as the URL OpenAI's image part takes (a data: URL for base64)."""
    source = block.get("source")
    need(isinstance(source, dict), f"{where}.source must be an object", where)
    if source.get("type") == "base64":
        need(isinstance(source.get("data"), str), f"{where}.source.data must be a base64 string", where)
        return f"data:{source.get('media_type') or 'image'};base64,{source['data']}"
    if source.get("type") == "url":
        need(isinstance(source.get("url"), str), f"{where}.source.url must be a string", where)
        return source["url"]
    raise Refused(f"{where}.source: {source.get('type')!r} sources are not supported by localrun: send the image as base64", where)


def _messages(data: dict) -> list[Message]:
    """Anthropic's system and messages as the request's: tool_use blocks become the assistant's calls, tool_result
    blocks tool messages (before the rest of that user turn), a user's image blocks images of its message."""
    out: list[Message] = []
    system = _text_of(data.get("system"), "system")
    raw = data.get("messages")
    need(isinstance(raw, list) and raw, "messages must be a non-empty list", "messages")
    used: set[str] = set()  # the tool_use ids so far: a tool_result answers one of them, as Anthropic's API requires
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        need(isinstance(m, dict) and m.get("role") in ("user", "assistant", "system"), f"{where}.role must be user or assistant", where)
        content = m.get("content")
        if m["role"] == "system":  # Claude Code sends them inside messages: each stays where it was put (the template places
            out.append(Message("system", _text_of(content, where + ".content")))  # it), so the prompt only grows
        elif isinstance(content, str) or content is None:
            out.append(Message(m["role"], content or ""))
        else:
            need(isinstance(content, list), f"{where}.content must be a string or a list of blocks", where)
            out += _turn(m["role"], content, where, used)
    return ([Message("system", system)] if system else []) + out


def _turn(role: str, content: list, where: str, used: set[str]) -> list[Message]:
    """One message's blocks: its text, thinking, tool calls and images, and a user's tool results before its text."""
    texts, calls, results, images, thoughts = [], [], [], [], []
    for j, block in enumerate(content):
        need(isinstance(block, dict), f"{where}.content.{j} must be a block", where)
        kind = block.get("type")
        if kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])  # the template writes it back where its model was trained to read it
        elif kind == "tool_use" and role == "assistant":
            need(isinstance(block.get("id"), str) and isinstance(block.get("name"), str), f"{where}.content.{j}: tool_use needs id and name", where)
            used.add(block["id"])
            calls.append(Call(block["name"], json.dumps(block.get("input") or {}, ensure_ascii=False), block["id"]))
        elif kind == "tool_result" and role == "user":
            results.append(_result(block, f"{where}.content.{j}", used))
        elif kind == "image" and role == "user":
            images.append(Image(_image_url(block, f"{where}.content.{j}"), f"{where}.content.{j}"))
        else:
            texts.append(_text_of([block], f"{where}.content"))
    text = "\n".join(t for t in texts if t)
    if role == "assistant":
        return [Message("assistant", text, calls=calls, thinking="\n".join(thoughts) if thoughts else None)]
    return results + ([Message("user", text, images=images)] if images or text or not results else [])


def _result(block: dict, where: str, used: set[str]) -> Message:
    need(isinstance(block.get("tool_use_id"), str), f"{where}: tool_result needs tool_use_id", where.rsplit(".content.", 1)[0])
    need(block["tool_use_id"] in used, f"{where}: tool_result's tool_use_id {block['tool_use_id']!r} answers no tool_use block"
         " before it", where)
    result = _text_of(block.get("content"), f"{where}.content")
    return Message("tool", ("Error: " + result) if block.get("is_error") else result, call_id=block["tool_use_id"])


# -- the answer ------------------------------------------------------------------------------------


def stop_reason(final, calls: list, stops: list[str]) -> tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence) of an answer."""
    if calls:
        return "tool_use", None
    if final.finish_reason == "length":  # at max_tokens, or the context full first (Anthropic's own reason for it)
        return ("model_context_window_exceeded" if final.context_full else "max_tokens"), None
    if final.finish_reason == "stop" and final.stop_sequence in stops:
        return "stop_sequence", final.stop_sequence
    return "end_turn", None


def usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens - stats.cached_tokens, "cache_read_input_tokens": stats.cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": stats.generated_tokens}


def _tool_use(call: dict) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call.get("id")), "name": call["name"], "input": call["arguments"]}


def tool_use_id(given: Optional[str]) -> str:
    """A call's id as Anthropic's clients know them (toolu_...); an id a template demands (Mistral's nine
    letters and digits) kept as it is."""
    if not given:
        return "toolu_" + uuid.uuid4().hex[:24]
    return "toolu_" + given.removeprefix("call_") if given.startswith("call_") else given


def message(model: str, text: str, thinking: str, calls: list, final, stops: list[str]) -> dict:
    """The whole answer as a Messages response."""
    content: list[dict] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if text:
        content.append({"type": "text", "text": text})
    content += [_tool_use(c) for c in calls]
    reason, sequence = stop_reason(final, calls, stops)
    return {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(final.stats)}


async def events(answer: AsyncIterator[Event], model: str, prompt_tokens: int, stops: list[str]) -> AsyncIterator[str]:
    """Anthropic's event sequence for an answer: message_start (with the prompt's cached part, known once a slot has
    matched its prefix: it waits for the prompt's first progress, milliseconds in, or seconds where the prompt waits
    for a slot or its first chunk is long: pings until then, which Anthropic's SDKs skip wherever they come), a
    content block per thinking/text/tool_use (start, deltas, stop), message_delta with the stop reason and usage,
    message_stop; pings meanwhile."""
    blocks = _Blocks()
    async for event in answer:
        if not blocks.begun and event.kind == "ping":
            yield sse("ping", {"type": "ping"})
            continue
        if not blocks.begun:
            blocks.begun = True
            yield _started(model, prompt_tokens, event.progress.cached if event.kind == "progress" else 0)
            yield sse("ping", {"type": "ping"})
        for line in blocks.on(event, stops):
            yield line
        if event.kind in ("failed", "done"):
            return


def _started(model: str, prompt_tokens: int, cached: int) -> str:
    return sse("message_start", {"type": "message_start", "message": {
        "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                  "output_tokens": 0}}})


class _Blocks:
    """The content blocks of one answer as its events come: the one open (thinking, text or tool_use) and its index."""

    def __init__(self) -> None:
        self.index, self.open_kind, self.calls, self.begun = -1, None, [], False

    def start(self, kind: str, block: dict) -> str:
        self.index += 1
        self.open_kind = kind
        return sse("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def delta(self, delta: dict) -> str:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def stop(self) -> list[str]:
        """The open block closed, if one is open."""
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def on(self, event: Event, stops: list[str]) -> list[str]:
        if event.kind == "ping":
            return [sse("ping", {"type": "ping"})]
        if event.kind in ("thinking", "text"):
            out = []
            if self.open_kind != event.kind:
                if self.open_kind == "thinking":  # its signature (none here), as Anthropic's thinking blocks end
                    out.append(self.delta({"type": "signature_delta", "signature": ""}))
                out += self.stop()
                out.append(self.start(event.kind, {"type": "thinking", "thinking": "", "signature": ""} if event.kind == "thinking"
                                      else {"type": "text", "text": ""}))
            return out + [self.delta({"type": "thinking_delta", "thinking": event.text} if event.kind == "thinking"
                                     else {"type": "text_delta", "text": event.text})]
        if event.kind == "call":  # a tool_use block begins; its input streams as the model writes it
            self.calls.append(event.id)
            out = [*self.stop(), self.start("tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}})]
            return out + ([self.delta({"type": "input_json_delta", "partial_json": event.text})] if event.text else [])
        if event.kind == "call_args":
            return [self.delta({"type": "input_json_delta", "partial_json": event.text})]
        if event.kind == "tool_calls":
            return self.stop()
        if event.kind == "failed":
            return [sse("error", {"type": "error", "error": {"type": "api_error", "message": event.text}})]
        if event.kind == "done":
            reason, sequence = stop_reason(event.final, self.calls, stops)
            return [*self.stop(), sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                                        "usage": usage(event.final.stats)}),  # the totals, cumulative as Anthropic's
                    sse("message_stop", {"type": "message_stop"})]
        return []
