"""Ollama's dialect (/api), on the same server as the OpenAI one: an Ollama body becomes the request the
OpenAI dialect makes a scheduler job of (so both answer alike), and the response stream is written in
Ollama's shapes: NDJSON objects with `message`/`response`, the last with `done_reason` and the durations
in nanoseconds. Errors are {"error": "..."} with the status Ollama uses (404 for an unknown model).

What Ollama clients send and localrun does not do yet is refused with 400 naming it (template); a `suffix`
fills in the middle in the model's own FIM tokens, generate's `context` continues an earlier exchange; Ollama's options that have no meaning here (numa, use_mmap, ...) are accepted and
ignored, as Ollama itself ignores options a runner does not use. Options and top-level fields Ollama does not
know either (Open WebUI's reasoning_effort and logit_bias in `options`, the AI SDK's top-level
max_output_tokens) are ignored with one line each on the server's stderr, as Ollama warns and goes on; the
top-level ones that say what an option says (temperature, top_p, max_output_tokens, tool_choice) are taken.
A known field or option of the wrong type is still a 400.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from collections.abc import AsyncIterator
from typing import Any, Optional

from pydantic import ValidationError

from ..runtime.options import OLLAMA_IGNORED, OLLAMA_LOAD
from .errors import ApiError
from .openai import ChatBody, CompletionBody, validation_error

# Ollama's option names (api.Options and api.Runner) -> localrun's request fields ("load" ones go to `options`,
# the load-time options the OpenAI dialect takes as Ollama does).
_SAMPLING = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
             "min_p": "min_p", "typical_p": "typical_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop",
             "mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta",
             # localrun's own: a cap on this request's lookup drafts (0: none), a GBNF grammar the answer follows, the most
             # tokens a reasoning model thinks (llama.cpp's reasoning budget)
             "draft_max": "draft_max", "grammar": "grammar", "reasoning_budget": "reasoning_budget"}
_LOAD = tuple(OLLAMA_LOAD)
_IGNORED = OLLAMA_IGNORED  # older clients send these
_REFUSED = {"template": "template (the model's own chat template is used)"}
# Top-level fields some Ollama clients send (the AI SDK's ollama-ai-provider-v2) that say what an option says.
_TOP_LEVEL = {"max_output_tokens": "num_predict", "max_tokens": "num_predict", **{name: name for name in _SAMPLING}}
_CHAT_FIELDS = {"model", "messages", "stream", "format", "options", "keep_alive", "think", "tools", "logprobs", "top_logprobs",
                "tool_choice", "truncate"}
_GENERATE_FIELDS = {"model", "prompt", "system", "stream", "format", "options", "keep_alive", "raw", "think", "images",
                    "suffix", "template", "context", "logprobs", "top_logprobs", "truncate"}


OLLAMA_VERSION = "0.14.0"  # the Ollama whose API this dialect speaks: what /api/version answers, for clients that check it



# Ollama's integer options (api.Options, api.Runner): a whole float is taken for them, as Ollama's JSON parsing does
_WHOLE = {"num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "mirostat", "num_ctx", "num_batch", "num_gpu",
          "main_gpu", "num_thread"}


def listed(entry: dict) -> dict:
    """An /api/tags or /api/ps entry with its names as Ollama lists them (listed_name)."""
    return {**entry, "name": listed_name(entry["name"]), "model": listed_name(entry["model"])}


def listed_name(name: str) -> str:
    """A model's name as Ollama lists it (/api/tags, /api/ps): with its tag, a created model's NAME being
    NAME:latest (clients match names with the tag: langchain-ollama's check of a model); a pulled model's
    OWNER/REPO:QUANT and a file's name as they are. Every form is taken in a request."""
    if ":" in name or "/" in name or name.lower().endswith(".gguf"):
        return name
    return name + ":latest"


def error(status: int, message: str) -> ApiError:
    return ApiError(status, message)


def error_answer(exc: ApiError, model: Optional[str] = None) -> tuple[int, dict]:
    """Ollama's error shape, {"error": "..."}, in its words where its clients know them."""
    message, status = exc.message, exc.status
    if exc.code == "model_not_found" and model:  # Ollama's wording, which its clients and users know
        message = f'model "{model}" not found, try pulling it first ({exc.message})'
    if exc.code == "queue_full":  # Ollama's answer when its queue is full: a 503, in its words
        message, status = f"server busy, please try again. maximum pending requests exceeded ({exc.message})", 503
    return status, {"error": message}


def ignored(endpoint: str, what: str) -> None:
    """One line on the server's stderr for a field or option the request may carry but nothing reads."""
    print(f"warning: {endpoint}: ignoring {what}, which localrun (as Ollama) does not know", file=sys.stderr, flush=True)


def body_for(data: Any, chat: bool) -> tuple[Any, dict]:
    """The OpenAI-dialect body for an Ollama /api/chat or /api/generate body, and what only Ollama's answer
    needs (stream, whether it is a load/unload request). ApiError(400) names what is wrong."""
    if not isinstance(data, dict):
        raise error(400, "the body must be a JSON object")
    endpoint = "/api/chat" if chat else "/api/generate"
    allowed = _CHAT_FIELDS if chat else _GENERATE_FIELDS
    top = {}  # options given at the top level: the body's own options win
    for name in sorted(set(data) - allowed):
        if name in _TOP_LEVEL and data[name] is not None:
            top[_TOP_LEVEL[name]] = data[name]
        elif name not in _TOP_LEVEL:
            ignored(endpoint, f"the field {name!r}")
    for name, why in _REFUSED.items():
        if data.get(name):
            raise error(400, f"{why} is not supported by localrun")
    model = model_named(data)
    flags(data, "stream", "raw", "truncate")
    think = data.get("think")
    if think is not None and not isinstance(think, (bool, str)):
        raise error(400, "think must be true, false (or a level: low, medium, high)")
    fields: dict[str, Any] = {"model": model, "keep_alive": data.get("keep_alive")}
    load = {}
    for name, value in {**top, **_options(data)}.items():
        if name in _WHOLE and isinstance(value, float) and value.is_integer():
            value = int(value)  # 5.0 for 5, as Ollama's options parse JSON numbers (a computed float from Python)
        if name in _SAMPLING:
            if name == "num_predict":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise error(400, f"invalid options.num_predict {value!r}: a whole number (-1: no limit)")
                value = value if value > 0 else None
            fields[_SAMPLING[name]] = value
        elif name in _LOAD:
            load[name] = value
        elif name not in _IGNORED:
            ignored(endpoint, f"the option {name!r}")
    if load:
        fields["options"] = load
    fmt = data.get("format")
    if fmt == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise error(400, f"invalid format {fmt!r}: \"json\" or a JSON schema")
    extra = {"stream": data.get("stream", True) is not False, "empty": False, "think": think}
    if isinstance(think, bool):  # the template's switch (Qwen3's enable_thinking), where it has one
        fields["chat_template_kwargs"] = {"enable_thinking": think}
    elif isinstance(think, str):  # a level (gpt-oss's low, medium, high): thinking on, at that effort
        if think not in ("low", "medium", "high"):
            raise error(400, f"invalid think {think!r}: true, false, or a level: low, medium, high")
        fields["chat_template_kwargs"] = {"enable_thinking": True}
        fields["reasoning_effort"] = think
    if data.get("logprobs"):  # as OpenAI's chat takes them; a raw completion below takes the count itself
        fields["logprobs"], fields["top_logprobs"] = True, data.get("top_logprobs") or 0
    elif data.get("top_logprobs"):
        raise error(400, "top_logprobs needs logprobs: true")
    names: list[str] = []  # the images' fields, in order: what an error about one names
    if chat:
        messages = data.get("messages") or []
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise error(400, "messages must be a list of objects")
        extra["empty"] = not messages
        fields["messages"] = [_message(m, f"messages.{i}.images", names) for i, m in enumerate(messages)] or [{"role": "user", "content": ""}]
        if data.get("tools"):
            fields["tools"] = data["tools"]  # OpenAI's function tools, as Ollama takes them
            fields["tool_choice"] = data.get("tool_choice")  # the AI SDK sends OpenAI's; Ollama's own clients none (auto)
        kind = ChatBody
    else:
        prompt = data.get("prompt") or ""
        if not isinstance(prompt, str):
            raise error(400, "prompt must be a string")
        extra["empty"] = not prompt and not data.get("images")
        system = data.get("system")
        if system is not None and not isinstance(system, str):
            raise error(400, "system must be a string")
        suffix = data.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise error(400, "suffix must be a string")
        if data.get("raw") or suffix:  # a suffix: fill in the middle, in the model's FIM tokens (as Ollama's code templates)
            if data.get("images"):
                raise error(400, f"images cannot combine with {'raw: true' if data.get('raw') else 'suffix'}"
                                 " (an image goes where the chat template puts it)")
            fields.pop("chat_template_kwargs", None)  # no template: nothing to switch
            fields["prompt"] = prompt
            if suffix:
                fields["suffix"] = suffix
            if fields.pop("logprobs", None):
                fields["logprobs"] = fields.pop("top_logprobs")
            kind = CompletionBody
        else:  # through the chat template, as Ollama does unless raw
            asked = _message({"role": "user", "content": prompt, "images": data.get("images")}, "images", names)
            fields["messages"] = ([{"role": "system", "content": system}] if system else []) + [asked]
            kind = ChatBody
            context = data.get("context")
            if context is not None and not (isinstance(context, list) and all(type(t) is int for t in context)):
                raise error(400, "context must be a list of token ids (the context an earlier answer gave)")
            extra["context"] = context or []
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        body = kind.model_validate(given)
    except ValidationError as exc:
        raise validation_error(exc, given, name_of=option_name) from None
    # a prompt over the context is cut, unless truncate: false (Ollama's); never a fill-in-the-middle prompt, which
    # would lose its markers (a 400 says to shorten it)
    body._truncate = data.get("truncate") is not False and not data.get("suffix")
    if chat:
        body._drop_oldest = True  # a conversation over the context keeps its newest messages, as Ollama's does
        body._tools_need_support = True  # tools for a model without them: a 400, as Ollama's
    elif extra.get("context") is not None:  # generate through the template: its context in, and out (see final)
        body._context = extra["context"]
    if isinstance(body, ChatBody):
        body._image_names = names
    return body, extra


def _message(m: dict, where: str, names: list[str]) -> dict:
    """An Ollama message as the OpenAI dialect takes it: tool calls with their arguments object, a tool
    result's `tool_name` as its name, its `images` (base64) as image parts before its text, their fields
    (`where`.0, ...) added to `names`."""
    out: dict[str, Any] = {"role": m.get("role"), "content": m.get("content") or ""}
    images = m.get("images")
    if images:
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise error(400, f"{where} must be a list of base64-encoded images")
        names += [f"{where}.{k}" for k in range(len(images))]
        text = out["content"] if isinstance(out["content"], str) else ""
        out["content"] = [*({"type": "image_url", "image_url": {"url": "data:image;base64," + i}} for i in images),
                          {"type": "text", "text": text}]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": c.get("function") if isinstance(c, dict) else c} for c in m["tool_calls"]]
    if m.get("role") == "tool" and m.get("tool_name"):
        out["name"] = m["tool_name"]
    if m.get("role") == "assistant" and isinstance(m.get("thinking"), str) and m["thinking"]:
        out["reasoning_content"] = m["thinking"]  # an earlier answer's thinking, for the template to write back
    return out


def with_tool_calls(message: dict, content: str, calls: list[dict]) -> dict:
    """The answer's message, with Ollama's tool_calls ({"function": {"name", "arguments": object}}) when the
    model called tools."""
    if not calls:
        return {**message, "content": content}
    return {**message, "content": content, "tool_calls": [{"function": {"name": c["name"], "arguments": c["arguments"]}}
                                                          for c in calls]}


def flags(data: dict, *names: str) -> None:
    """Fields that are true or false: another type is a 400 (as Ollama's own decoding refuses it)."""
    for name in names:
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise error(400, f"{name} must be true or false")


def option_name(field: str) -> str:
    """A request field as an Ollama client wrote it: the option it came from (max_tokens -> options.num_predict)."""
    name = next((o for o, f in _SAMPLING.items() if f == field), None)
    return field if name is None else f"options.{name}"


def without_template(body: ChatBody) -> "ChatBody | CompletionBody":
    """/api/generate for a model with no chat template (a base model): the prompt as it is, as Ollama's
    default template ({{ .Prompt }}) gives it; a system prompt goes before it. A body with images stays a chat
    body: the request path gives it as plain text too, each image before its message's text."""
    if any(m.image_parts() for m in body.messages):
        return body
    text = "\n\n".join(m.text() for m in body.messages if m.text())
    fields = body.model_dump(exclude={"messages", "max_completion_tokens", "logprobs", "top_logprobs", "chat_template_kwargs",
                                      "reasoning_format", "reasoning_effort"}, exclude_none=True)
    if body.logprobs:
        fields["logprobs"] = body.top_logprobs or 0
    return CompletionBody.model_validate({**fields, "prompt": text})


def logprobs_of(engine, entries) -> list[dict]:
    """Ollama's logprobs: token text and logprob, with the alternatives as top_logprobs."""
    def text(token: int) -> str:
        return engine.token_bytes(token).decode("utf-8", "replace")

    return [{"token": text(e.token), "logprob": e.logprob, "top_logprobs": [{"token": text(t), "logprob": lp} for t, lp in e.top]}
            for e in entries]


def embed_request(data: Any, legacy: bool) -> tuple[Any, list[str], bool, Optional[int]]:
    """(a body resident_for takes, the texts, truncate, dimensions) of /api/embed, or of the older
    /api/embeddings (`legacy`: one `prompt`)."""
    from types import SimpleNamespace

    if not isinstance(data, dict):
        raise error(400, "the body must be a JSON object")
    endpoint = "/api/embeddings" if legacy else "/api/embed"
    allowed = {"model", "prompt", "options", "keep_alive"} if legacy else {"model", "input", "truncate", "options", "keep_alive", "dimensions"}
    for name in sorted(set(data) - allowed):
        ignored(endpoint, f"the field {name!r}")
    model = model_named(data)
    flags(data, "truncate")
    given = data.get("prompt") if legacy else data.get("input")
    texts = ([given] if given else []) if isinstance(given, str) else list(given or [])  # "" is no text: no embeddings, as Ollama's
    if not all(isinstance(t, str) for t in texts):
        raise error(400, "input must be a string or a list of strings")
    options = _options(data)
    load = {k: v for k, v in options.items() if k in _LOAD}
    for name in sorted(set(options) - set(_LOAD) - set(_SAMPLING) - set(_IGNORED)):
        ignored(endpoint, f"the option {name!r}")
    dimensions = data.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise error(400, f"invalid dimensions {dimensions!r}")
    body = SimpleNamespace(model=model, keep_alive=data.get("keep_alive"), options=load or None)
    return body, [t for t in texts if t != ""] if legacy else texts, data.get("truncate", True) is not False, dimensions


def model_named(data: Any) -> str:
    """The model a body names (`model`, or the older `name` that /api/show, /api/pull and /api/delete take)."""
    ref = data.get("model") if isinstance(data, dict) else None
    if ref in (None, "") and isinstance(data, dict):
        ref = data.get("name")
    if not isinstance(ref, str) or not ref:
        raise error(400, "model is required" if ref in (None, "") else "model must be a string")
    return ref


def _options(data: dict) -> dict:
    """A body's `options`, those set (a null is not set: LangChain sends every one)."""
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise error(400, "options must be an object")
    return {k: v for k, v in options.items() if v is not None}


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def piece(model: str, chat: bool, text: str, logprobs: Optional[list] = None, thinking: str = "") -> dict:
    out: dict[str, Any] = {"model": model, "created_at": now(), "done": False}
    if chat:
        out["message"] = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
    else:
        out["response"] = text
        if thinking:
            out["thinking"] = thinking
    if logprobs is not None:
        out["logprobs"] = logprobs
    return out


def final(model: str, chat: bool, text: str, response, *, started: float, load_s: float, logprobs: Optional[list] = None,
          thinking: str = "", context: Optional[list[int]] = None) -> dict:
    """The last object: the whole answer when not streamed ('' when it was), how it ended, and the
    durations in nanoseconds (as Ollama reports them); generate's `context` where there is one."""
    stats = response.stats
    out = piece(model, chat, text, logprobs, thinking)
    out.update({
        "done": True, "done_reason": "length" if response.finish_reason == "length" else "stop",
        **({"context": context} if context is not None else {}),
        "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": int(load_s * 1e9),
        "prompt_eval_count": stats.prompt_tokens, "prompt_eval_duration": int(stats.prompt_eval_s * 1e9),
        "eval_count": stats.generated_tokens, "eval_duration": int(stats.eval_s * 1e9),
    })
    return out


def loaded(model: str, chat: bool, reason: str) -> dict:
    """The answer to an empty request: the model was loaded ('load') or unloaded ('unload')."""
    out = piece(model, chat, "")
    out.update({"done": True, "done_reason": reason})
    return out


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def lines(events, model: str, chat: bool, *, started: float, load_s: float, engine=None,
                logprobs: bool = False, context=None) -> AsyncIterator[str]:
    """An answer's events (serve.stream.answer_events) as Ollama's NDJSON stream: a line per piece of
    thinking or text, the tool calls in a line of their own, then the last line with the totals (and
    generate's `context`: `context(text)` of the whole answer) or {"error"} when the answer failed."""
    said: list[str] = []
    async for e in events:
        if e.kind == "ping":  # an empty piece: Ollama's stream has no comment lines, and a client waiting stays
            yield line(piece(model, chat, ""))
        elif e.kind == "thinking":
            yield line(piece(model, chat, "", thinking=e.text))
        elif e.kind == "text":
            said.append(e.text)
            yield line(piece(model, chat, e.text, logprobs_of(engine, e.logprobs) if logprobs else None))
        elif e.kind == "tool_calls":
            part = piece(model, chat, "")
            part["message"] = with_tool_calls(part["message"], "", e.calls)
            yield line(part)
        elif e.kind == "failed":
            yield line({"error": e.text})
        elif e.kind == "done":
            yield line(final(model, chat, "", e.final, started=started, load_s=load_s,
                             context=context("".join(said)) if context is not None else None))
