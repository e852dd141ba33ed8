"""Ollama's dialect (/api): an Ollama body (chat, generate, embed) translated into localrun's request
(serve.asked.Asked: `asked_of`, `embed_asked`), so that it is answered as every dialect is; the answer's events
written in Ollama's shapes: NDJSON objects with `message`/`response`, the last with `done_reason` and the
durations in nanoseconds. Errors are {"error": "..."} with the status Ollama uses (404 for an unknown model), the
options named as Ollama's clients name them (options.num_predict). Pure: no HTTP here (serve/routes/ollama.py).

What Ollama clients send and localrun does not do yet is refused with 400 naming it (template); a `suffix`
fills in the middle in the model's own FIM tokens, generate's `context` continues an earlier exchange; Ollama's
options that have no meaning here (numa, use_mmap, ...) are accepted and ignored, as Ollama itself ignores options
a runner does not use. Options and top-level fields Ollama does not know either (Open WebUI's reasoning_effort
and logit_bias in `options`, the AI SDK's top-level max_output_tokens) are ignored with one line each on the
server's stderr, as Ollama warns and goes on; the top-level ones that say what an option says (temperature,
top_p, max_output_tokens, tool_choice) are taken. A known field or option of the wrong type is still a 400.
Tools and thinking asked of a model without them are refused, as Ollama refuses them; a conversation over the
context drops its oldest messages and a prompt over it is cut (unless truncate: false), as Ollama's."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ...runtime.options import OLLAMA_IGNORED, OLLAMA_LOAD, OLLAMA_RENAMED, ollama_name
from ..asked import Asked, Call, Image, Message, Reply
from ..checks import (FunctionTool, load_options, need, openai_choice, options_name, sampling_of, settings, stops_of, tool_of,
                      top_logprobs, validated)
from ..errors import Fault, Wording, fault
from ..stream import Event
from ..wire import ndjson

# Ollama's option names (api.Options and api.Runner) -> localrun's request fields ("load" ones go to `options`,
# the load-time options the OpenAI dialect takes as Ollama does).
_SAMPLING = {**OLLAMA_RENAMED, **{name: name for name in (
    "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "seed", "stop", "mirostat", "mirostat_tau", "mirostat_eta",
    # localrun's own: a cap on this request's lookup drafts (0: none), a GBNF grammar the answer follows, the most
    # tokens a reasoning model thinks (llama.cpp's reasoning budget)
    "draft_max", "grammar", "reasoning_budget")}}
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


def option_name(field: str) -> str:
    """A request field as an Ollama client wrote it: the option it came from (max_tokens -> options.num_predict, a
    load setting -> options.num_ctx)."""
    if field == "load" or field.startswith("load."):
        return options_name(field)
    return f"options.{ollama_name(field)}" if field in _SAMPLING.values() else field


WORDING = Wording(more_context="raise options.num_ctx (or restart the server with a larger --ctx)", name_of=option_name,
                  load_options=frozenset(OLLAMA_LOAD.values()),  # (not num_parallel: see _LOAD)
                  no_projector="start the server with --mmproj FILE for it, or put its mmproj-*.gguf beside the model file")


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    return error_shape(fault(exc, WORDING), model)


def error_shape(f: Fault, model: Optional[str] = None) -> tuple[int, dict]:
    """Ollama's error shape, {"error": "..."}, in its words where its clients know them."""
    message, status = f.message, f.status
    if f.code == "model_not_found" and model:  # Ollama's wording, which its clients and users know
        message = f'model "{model}" not found, try pulling it first ({f.message})'
    if f.code == "queue_full":  # Ollama's answer when its queue is full: a 503, in its words
        message, status = f"server busy, please try again. maximum pending requests exceeded ({f.message})", 503
    return status, {"error": message}


def ignored(endpoint: str, what: str) -> None:
    """One line on the server's stderr for a field or option the request may carry but nothing reads."""
    print(f"warning: {endpoint}: ignoring {what}, which localrun (as Ollama) does not know", file=sys.stderr, flush=True)


# -- a chat or generate body -----------------------------------------------------------------------


def asked_of(data: Any, chat: bool) -> Asked:
    """The request an Ollama /api/chat or /api/generate body asks for; refused naming what is wrong."""
    need(isinstance(data, dict), "the body must be a JSON object")
    endpoint = "/api/chat" if chat else "/api/generate"
    top = _top_level(data, _CHAT_FIELDS if chat else _GENERATE_FIELDS, endpoint)
    for name, why in _REFUSED.items():
        need(not data.get(name), f"{why} is not supported by localrun")
    model = model_named(data)
    flags(data, "stream", "raw", "truncate")
    think, effort = _think(data.get("think"))
    values, load = _option_values({**top, **_options(data)}, endpoint)
    values = settings({"model": model, "keep_alive": data.get("keep_alive"), **values, **_logprobs(data)})
    what = _chat(data) if chat else _generate(data)
    reply = Reply(stream=data.get("stream", True) is not False, load_only=what.pop("load_only"))
    return Asked(model=model, keep_alive=values["keep_alive"], load=load_options(load), sampling=sampling_of(values),
                 stops=stops_of(values.get("stop")), max_tokens=values.get("max_tokens"), draft_max=values.get("draft_max"),
                 top_logprobs=top_logprobs(values["top_logprobs"], "top_logprobs") if "top_logprobs" in values else None,
                 think=think, effort=effort, strict=True, **_format(data.get("format")), **what, reply=reply,
                 # a prompt over the context is cut, unless truncate: false (Ollama's); never a fill-in-the-middle prompt,
                 # which would lose its markers (a 400 says to shorten it)
                 truncate=data.get("truncate") is not False and not data.get("suffix"))


def _top_level(data: dict, allowed: set, endpoint: str) -> dict:
    """Options given at the top level (some clients send them there; the body's own options win); any other field
    Ollama does not know is ignored, said once on stderr."""
    top = {}
    for name in sorted(set(data) - allowed):
        if name in _TOP_LEVEL and data[name] is not None:
            top[_TOP_LEVEL[name]] = data[name]
        elif name not in _TOP_LEVEL:
            ignored(endpoint, f"the field {name!r}")
    return top


def _option_values(options: dict, endpoint: str) -> tuple[dict, dict]:
    """(the sampling settings in localrun's names, the load options in Ollama's) of a body's options."""
    values, load = {}, {}
    for name, value in options.items():
        if name in _WHOLE and isinstance(value, float) and value.is_integer():
            value = int(value)  # 5.0 for 5, as Ollama's options parse JSON numbers (a computed float from Python)
        if name == "num_predict":
            need(isinstance(value, int) and not isinstance(value, bool), f"invalid options.num_predict {value!r}: a whole number (-1: no limit)")
            value = value if value > 0 else None
        if name in _SAMPLING:
            if value is not None:
                values[_SAMPLING[name]] = value
        elif name in _LOAD:
            load[name] = value
        elif name not in _IGNORED:
            ignored(endpoint, f"the option {name!r}")
    return values, load


def _think(think: Any) -> tuple[Optional[bool], Optional[str]]:
    """(the template's thinking switch, the effort) of `think`: true, false, or a level (gpt-oss's low, medium, high:
    thinking on, at that effort)."""
    need(think is None or isinstance(think, (bool, str)), "think must be true, false (or a level: low, medium, high)")
    if isinstance(think, str):
        need(think in ("low", "medium", "high"), f"invalid think {think!r}: true, false, or a level: low, medium, high")
        return True, think
    return think, None


def _logprobs(data: dict) -> dict:
    if data.get("logprobs"):  # as OpenAI's chat takes them
        return {"top_logprobs": data.get("top_logprobs") or 0}
    need(not data.get("top_logprobs"), "top_logprobs needs logprobs: true")
    return {}


def _format(fmt: Any) -> dict:
    """`format`: "json" (a JSON object), or a JSON schema the answer follows."""
    if fmt == "json":
        return {"json_object": True}
    if isinstance(fmt, dict):
        return {"json_schema": fmt}
    need(fmt in (None, ""), f"invalid format {fmt!r}: \"json\" or a JSON schema")
    return {}


def _chat(data: dict) -> dict:
    """/api/chat's messages (their images named messages.0.images.0) and tools; a conversation over the context drops
    its oldest messages, as Ollama's does. No messages: the model is only loaded."""
    messages = data.get("messages") or []
    need(isinstance(messages, list) and all(isinstance(m, dict) for m in messages), "messages must be a list of objects")
    out = dict(messages=[_message(m, f"messages.{i}") for i, m in enumerate(messages)] or [Message("user", "")],
               drop_oldest=True, load_only=not messages)
    if data.get("tools"):  # OpenAI's function tools, as Ollama takes them; the AI SDK sends OpenAI's tool_choice too
        tools = validated(_Tools, {"tools": data["tools"]})
        out.update(tools=[tool_of(t.function) for t in tools.tools], choice=openai_choice(data.get("tool_choice")))
    return out


def _generate(data: dict) -> dict:
    """/api/generate's prompt: through the chat template (its system prompt before it, its images named images.0;
    `context`: an earlier exchange's tokens before it), or as it is (raw, or a suffix to fill in before). No prompt
    and no images: the model is only loaded."""
    prompt, system, suffix = data.get("prompt") or "", data.get("system"), data.get("suffix")
    need(isinstance(prompt, str), "prompt must be a string")
    need(system is None or isinstance(system, str), "system must be a string")
    need(suffix is None or isinstance(suffix, str), "suffix must be a string")
    load_only = not prompt and not data.get("images")
    if data.get("raw") or suffix:  # a suffix: fill in the middle, in the model's FIM tokens (as Ollama's code templates)
        need(not data.get("images"), f"images cannot combine with {'raw: true' if data.get('raw') else 'suffix'}"
                                     " (an image goes where the chat template puts it)")
        return dict(prompt=prompt, suffix=suffix or None, load_only=load_only)
    context = data.get("context")
    need(context is None or (isinstance(context, list) and all(type(t) is int for t in context)),
         "context must be a list of token ids (the context an earlier answer gave)")
    asked = _message({"role": "user", "content": prompt, "images": data.get("images")}, "")
    return dict(messages=([Message("system", system)] if system else []) + [asked], context=context or [],
                plain_without_template=True, load_only=load_only)


class _Function(BaseModel):
    name: StrictStr = Field(min_length=1)
    arguments: Union[StrictStr, dict[str, Any]] = "{}"


class _Call(BaseModel):
    model_config = ConfigDict(extra="allow")
    function: _Function


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # what Ollama's own clients add: harmless
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[str] = None
    tool_calls: Optional[list[_Call]] = None


class _Tools(BaseModel):
    tools: list[FunctionTool]


def _message(m: dict, where: str) -> Message:
    """An Ollama message: its tool calls, a tool result's `tool_name`, its `images` (base64, named `where`.images.0),
    an assistant's earlier `thinking` (for the template to write back)."""
    images = m.get("images")
    named = f"{where}.images" if where else "images"
    need(not images or (isinstance(images, list) and all(isinstance(i, str) for i in images)),
         f"{named} must be a list of base64-encoded images")
    message = validated(_Message, {k: v for k, v in m.items() if k in ("role", "content", "tool_calls")}, f"{where}." if where else "")
    tool_name, thinking = m.get("tool_name"), m.get("thinking")
    return Message(role="system" if message.role == "developer" else message.role, text=message.content or "",
                   images=[Image("data:image;base64," + image, f"{named}.{k}") for k, image in enumerate(images or [])],
                   calls=[Call(c.function.name, c.function.arguments) for c in message.tool_calls or []],
                   name=tool_name if message.role == "tool" and isinstance(tool_name, str) and tool_name else None,
                   thinking=thinking if message.role == "assistant" and isinstance(thinking, str) and thinking else None)


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
        need(data.get(name) is None or isinstance(data[name], bool), f"{name} must be true or false")


def logprobs_of(facts, entries) -> list[dict]:
    """Ollama's logprobs: token text and logprob, with the alternatives as top_logprobs."""
    def text(token: int) -> str:
        return facts.token_bytes(token).decode("utf-8", "replace")

    return [{"token": text(e.token), "logprob": e.logprob, "top_logprobs": [{"token": text(t), "logprob": lp} for t, lp in e.top]}
            for e in entries]


# -- embeddings and models -------------------------------------------------------------------------


def embed_asked(data: Any, legacy: bool) -> tuple[Asked, list[str], bool, Optional[int]]:
    """(the request's model and load, the texts, truncate, dimensions) of /api/embed, or of the older
    /api/embeddings (`legacy`: one `prompt`)."""
    need(isinstance(data, dict), "the body must be a JSON object")
    endpoint = "/api/embeddings" if legacy else "/api/embed"
    allowed = {"model", "prompt", "options", "keep_alive"} if legacy else {"model", "input", "truncate", "options", "keep_alive", "dimensions"}
    for name in sorted(set(data) - allowed):
        ignored(endpoint, f"the field {name!r}")
    model = model_named(data)
    flags(data, "truncate")
    given = data.get("prompt") if legacy else data.get("input")
    texts = ([given] if given else []) if isinstance(given, str) else list(given or [])  # "" is no text: no embeddings, as Ollama's
    need(all(isinstance(t, str) for t in texts), "input must be a string or a list of strings")
    options = _options(data)
    for name in sorted(set(options) - set(_LOAD) - set(_SAMPLING) - set(_IGNORED)):
        ignored(endpoint, f"the option {name!r}")
    dimensions = data.get("dimensions")
    need(dimensions is None or (isinstance(dimensions, int) and not isinstance(dimensions, bool) and dimensions >= 1),
         f"invalid dimensions {dimensions!r}")
    asked = Asked(model=model, keep_alive=data.get("keep_alive"), load=load_options({k: v for k, v in options.items() if k in _LOAD}))
    return asked, [t for t in texts if t != ""] if legacy else texts, data.get("truncate", True) is not False, dimensions


def model_named(data: Any) -> str:
    """The model a body names (`model`, or the older `name` that /api/show, /api/pull and /api/delete take)."""
    ref = data.get("model") if isinstance(data, dict) else None
    if ref in (None, "") and isinstance(data, dict):
        ref = data.get("name")
    need(isinstance(ref, str) and bool(ref), "model is required" if ref in (None, "") else "model must be a string")
    return ref


def _options(data: dict) -> dict:
    """A body's `options`, those set (a null is not set: LangChain sends every one)."""
    options = data.get("options") or {}
    need(isinstance(options, dict), "options must be an object")
    return {k: v for k, v in options.items() if v is not None}


# -- the answer ------------------------------------------------------------------------------------


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


async def lines(events: AsyncIterator[Event], model: str, chat: bool, *, started: float, load_s: float, facts=None,
                logprobs: bool = False, context=None) -> AsyncIterator[str]:
    """An answer's events (serve.stream.answer_events) as Ollama's NDJSON stream: a line per piece of
    thinking or text, the tool calls in a line of their own, then the last line with the totals (and
    generate's `context`: `context(text)` of the whole answer) or {"error"} when the answer failed."""
    said: list[str] = []
    async for e in events:
        if e.kind == "ping":  # an empty piece: Ollama's stream has no comment lines, and a client waiting stays
            yield ndjson(piece(model, chat, ""))
        elif e.kind == "thinking":
            yield ndjson(piece(model, chat, "", thinking=e.text))
        elif e.kind == "text":
            said.append(e.text)
            yield ndjson(piece(model, chat, e.text, logprobs_of(facts, e.logprobs) if logprobs else None))
        elif e.kind == "tool_calls":
            part = piece(model, chat, "")
            part["message"] = with_tool_calls(part["message"], "", e.calls)
            yield ndjson(part)
        elif e.kind == "failed":
            yield ndjson({"error": e.text})
        elif e.kind == "done":
            yield ndjson(final(model, chat, "", e.final, started=started, load_s=load_s,
                             context=context("".join(said)) if context is not None else None))
