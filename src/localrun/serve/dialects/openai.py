"""The OpenAI dialect (/v1/chat/completions, /v1/completions, /v1/embeddings): its request bodies, strict as OpenAI's
API is (with llama-server's and Ollama's own fields that their clients send here too), translated into localrun's
request (serve.asked.Asked: `chat_asked`, `completion_asked`); the answer's events written as its JSON and
server-sent events; its error shape. Pure: no HTTP here (serve/routes/openai.py serves it)."""

from __future__ import annotations

import base64
import json
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model, model_validator

from ...runtime import Response, SamplingOptions, Stats
from ...runtime.options import DRAFT_MAX, OLLAMA_IGNORED, OLLAMA_LOAD
from ..asked import Asked, Call, Image, Message, Reply
from ..checks import (SAMPLING_FIELDS, FunctionTool, load_options, openai_choice, options_name, stops_of,
                      strict, tool_of, top_logprobs, validated)
from ..errors import LOAD_SETTINGS, Fault, Refused, Unsupported, Wording, fault
from ..stream import FINISH_REASONS, Event
from ..wire import BadJson, parse_json

WORDING = Wording(more_context="restart the server with a larger --ctx", name_of=options_name,
                  load_options=LOAD_SETTINGS,  # its `options` take them all (checks.load_options)
                  no_projector="start the server with --mmproj FILE for it, or put its mmproj-*.gguf beside the model file")


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return error_shape(fault(exc, WORDING))


def error_shape(f: Fault) -> tuple[int, dict]:
    return f.status, {"error": {"message": f.message, "type": f.kind, "param": f.param, "code": f.code}}


# -- request bodies --------------------------------------------------------------------------------


# Ollama's and llama-server's own top-level parameters, which clients written for them send on /v1 too (Open
# WebUI's Advanced Params): the load-time ones are taken as `options`, the length as max_tokens, and those
# that mean nothing here are ignored with one line each on stderr, as Ollama's /v1 and llama-server ignore them.
_FOREIGN_LOAD = frozenset(OLLAMA_LOAD)
_FOREIGN_LENGTH = frozenset({"num_predict", "n_predict"})
_FOREIGN_IGNORED = frozenset({
    *OLLAMA_IGNORED, "n_keep", "penalize_nl", "cache_prompt", "n_probs", "samplers", "dynatemp_range", "dynatemp_exponent", "id_slot", "slot_id", "t_max_predict_ms", "timings_per_token",
    "return_tokens", "post_sampling_probs", "n_indent", "top_n_sigma", "min_keep", "n_cmpl", "response_fields",
    "speculative.n_min", "speculative.p_min"})
_FOREIGN_DRAFT = frozenset({"speculative.n_max"})  # llama-server's per-request cap on a draft: our draft_max
_FOREIGN_BUDGET = frozenset({"reasoning_budget_tokens", "thinking_budget_tokens"})  # llama-server's: our reasoning_budget
_FOREIGN = _FOREIGN_LOAD | _FOREIGN_LENGTH | _FOREIGN_IGNORED | _FOREIGN_DRAFT | _FOREIGN_BUDGET


class _Fields(BaseModel):
    # Unknown fields are refused (as OpenAI's API does) rather than silently ignored.
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _foreign(cls, data: Any) -> Any:
        """Ollama's and llama-server's top-level parameters (_FOREIGN) as this dialect's fields; null for a field
        with a default (n, stream, echo: nullable in OpenAI's spec, and sent so by some clients) as left out."""
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            data = {k: v for k, v in data.items() if not (v is None and k in fields and fields[k].default is not None
                                                          and not fields[k].is_required())}
        if not isinstance(data, dict) or not _FOREIGN.intersection(data):
            return data
        data, load = dict(data), {}
        for name in sorted(_FOREIGN.intersection(data)):
            value = data.pop(name)
            if name in _FOREIGN_LOAD and value is not None:
                load[name] = value
            elif name in _FOREIGN_DRAFT:  # llama-server takes any count: more than a slot drafts is the slot's
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise Refused(f"invalid {name!r}: a whole number, 0 or more (0: no drafts)", name)
                if data.get("draft_max") is None:
                    data["draft_max"] = min(value, DRAFT_MAX)
            elif name in _FOREIGN_BUDGET:
                if data.get("reasoning_budget") is None:
                    data["reasoning_budget"] = value
            elif name in _FOREIGN_LENGTH:
                unlimited = isinstance(value, int) and not isinstance(value, bool) and value <= 0
                if value is not None and not unlimited and data.get("max_tokens") is None:
                    data["max_tokens"] = value
            elif name in _FOREIGN_IGNORED:
                print(f"warning: ignoring {name!r}, which has no meaning for localrun's /v1", file=sys.stderr, flush=True)
        if load:
            given = data.get("options")
            data["options"] = {**load, **given} if isinstance(given, dict) else (load if given is None else given)
        return data

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    stop: Union[StrictStr, list[StrictStr], None] = None
    stream: StrictBool = False
    stream_options: Optional[dict[str, StrictBool]] = None
    n: StrictInt = Field(1, ge=1, le=16, description="choices: each its own sequence, decoded side by side in the slots")
    user: Optional[str] = None
    logit_bias: Optional[dict[int, float]] = None
    response_format: Optional[dict[str, Any]] = None
    ignore_eos: StrictBool = Field(False, description="llama.cpp server's extension: generate exactly max_tokens")
    return_progress: StrictBool = Field(False, description="llama.cpp server's extension: a stream says how far its prompt is "
                                        "(prompt_progress: total, cache, processed, time_ms)")
    draft_max: Optional[StrictInt] = Field(None, ge=0, le=DRAFT_MAX, description="at most this many tokens drafted a step by prompt "
                                           "lookup, where the model drafts (serve --draft lookup, a catalogue default); 0: none")
    lora: Optional[list[Any]] = Field(None, description="llama.cpp server's extension: this request's LoRA scales, "
                                      '[{"id": N, "scale": X}] (an adapter left out: 0), without a reload')
    # Sent (mostly with their off values) by common clients: accepted when off, refused when asked for.
    logprobs: Union[StrictBool, StrictInt, None] = None
    top_logprobs: Optional[StrictInt] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: Optional[StrictBool] = None
    functions: Optional[list[Any]] = None
    function_call: Union[str, dict[str, Any], None] = None
    # Current OpenAI fields that do not change what the model must write: accepted and ignored, as Ollama
    # and llama-server do (caching and routing hints, storage, identifiers, a predicted output).
    store: Optional[StrictBool] = None
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None
    prediction: Optional[dict[str, Any]] = None
    # ... and those that would: refused by name unless asked for off (see _unsupported).
    modalities: Optional[list[StrictStr]] = None
    audio: Optional[dict[str, Any]] = None
    web_search_options: Optional[dict[str, Any]] = None
    # Ollama's per-request fields, which localrun's resident server takes on /v1 too: how long the model
    # stays loaded after this answer, and load-time options (a model loaded with others is reloaded).
    keep_alive: Union[StrictInt, StrictFloat, StrictStr, None] = None
    options: Optional[dict[str, Any]] = None


_Body = create_model(
    "_Body", __base__=_Fields,
    **{name: (Optional[strict(SamplingOptions.model_fields[name].annotation)], None) for name in SAMPLING_FIELDS},
)


class CompletionBody(_Body):
    # OpenAI's API takes a list of prompts too (LangChain's OpenAI LLM always sends one): a list of one is
    # that prompt; several are refused by name (completion_asked).
    prompt: Union[StrictStr, list[StrictInt], list[StrictStr], list[list[StrictInt]]]
    echo: StrictBool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None


def _unsupported(body) -> Optional[str]:
    """The first feature asked for that localrun does not do, or None."""
    if isinstance(body, CompletionBody):
        if body.echo:
            return "echo"
        if body.best_of not in (None, 1):
            return "best_of"
    if isinstance(body, CompletionBody) and (body.tools or body.tool_choice not in (None, "none")):
        return "tools"  # a chat feature: the template renders them
    if body.functions or body.function_call not in (None, "none"):
        return "functions"  # OpenAI's older form: send tools instead
    if body.modalities and set(body.modalities) - {"text"}:
        return "modalities"  # text is all a GGUF language model writes
    if body.audio is not None:
        return "audio"
    if body.web_search_options is not None:
        return "web_search_options"
    if body.n > 1 and body.stream:
        return "n with stream"  # several choices come back whole
    return None


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str
    cache_control: Optional[dict[str, Any]] = None  # a prompt-caching hint (litellm forwards Anthropic's): the prefix cache is automatic


class _RefusalPart(BaseModel):
    """An assistant's refusal in its content (OpenAI's SDKs send it back in the history): read as its text."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["refusal"]
    refusal: str

    @property
    def text(self) -> str:
        return self.refusal


class _ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: StrictStr
    detail: Optional[Literal["auto", "low", "high"]] = None  # how OpenAI sizes it: a projector has its own size


class _ImagePart(BaseModel):
    """An image in a message: a data: URL with the image's bytes in base64 (runtime.images.image_from_url)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: Union[StrictStr, _ImageUrl]
    cache_control: Optional[dict[str, Any]] = None

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


class _Function(BaseModel):
    name: StrictStr = Field(min_length=1)
    arguments: Union[StrictStr, dict[str, Any]] = "{}"


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: _Function


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, ...: harmless
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[Annotated[Union[_Part, _ImagePart, _RefusalPart], Field(discriminator="type")]], None] = None
    tool_calls: Optional[list[_ToolCall]] = None
    tool_call_id: Optional[str] = None

    @model_validator(mode="after")
    def _has_content(self):
        # Only an assistant message that calls tools may leave its content out (OpenAI's rule).
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("a message needs its content (only an assistant's tool calls may go without)")
        if self.role != "assistant" and isinstance(self.content, list) and any(isinstance(p, _RefusalPart) for p in self.content):
            raise ValueError("a refusal part belongs to an assistant's message only")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, (_Part, _RefusalPart)))
        return self.content or ""

    def image_parts(self) -> list[tuple[int, "_ImagePart"]]:
        """(index in content, part) of each image, in order."""
        return [(j, p) for j, p in enumerate(self.content) if isinstance(p, _ImagePart)] if isinstance(self.content, list) else []


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    # A reasoning model's thinking: apart in reasoning_content (auto; deepseek, as llama.cpp's server names
    # it), or left inline in the content (none); the template's switch (Qwen3's enable_thinking).
    reasoning_format: Optional[Literal["auto", "deepseek", "none"]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None  # to the template (gpt-oss reads it); "none" turns thinking off


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    input: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None
    keep_alive: Union[StrictInt, StrictFloat, StrictStr, None] = None
    options: Optional[dict[str, Any]] = None


def embedding_inputs(body: EmbeddingsBody) -> list:
    """The texts (or token id lists) of an embeddings request, one per vector."""
    given = body.input
    if isinstance(given, str):
        given = [given]
    elif given and isinstance(given[0], int):
        given = [given]  # one text as token ids
    if not given or any(len(t) == 0 for t in given):
        raise Refused("input must not be empty (nor hold an empty text)", "input")
    return list(given)


def embeddings_asked(body: EmbeddingsBody) -> Asked:
    """What an embeddings request asks of the model itself: which, loaded how, kept how long."""
    return Asked(model=body.model, keep_alive=body.keep_alive, load=load_options(body.options))


def embeddings_answer(model_id: str, result, encoding_format: str) -> dict:
    def encoded(vector: list[float]):
        if encoding_format == "base64":  # little-endian float32, as OpenAI sends them
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return vector

    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(result.vectors)],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


def parse_body(raw: bytes, kind: type[BaseModel]) -> Any:
    """A body of `kind` (ChatBody, CompletionBody, EmbeddingsBody) from its bytes; refused naming its first bad field."""
    return validated(kind, _json_object(raw))


def _json_object(raw: bytes) -> dict:
    """A body's bytes as the JSON object they must be; refused otherwise."""
    try:
        data = parse_json(raw)
    except BadJson as exc:
        raise Refused(f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise Refused("the body must be a JSON object")
    return data


def template_body(raw: bytes) -> tuple[ChatBody, bool]:
    """llama-server's /apply-template body: a chat body, and its add_generation_prompt (false: the conversation
    rendered without the assistant's turn opened), which only this endpoint takes."""
    data = _json_object(raw)
    opened = data.pop("add_generation_prompt", True)
    if not isinstance(opened, bool):
        raise Refused("add_generation_prompt must be true or false", "add_generation_prompt")
    return validated(ChatBody, data), opened


def chat_asked(body: ChatBody) -> Asked:
    """The request a chat body asks for: its messages (images named by their place, messages.0.content.1), tools,
    tool_choice, the template's thinking switch and effort."""
    kwargs = dict(body.chat_template_kwargs or {})
    if not isinstance(kwargs.get("enable_thinking", True), bool):
        raise Refused("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs")
    think = kwargs.pop("enable_thinking", None)  # the template's switch (Qwen3's)
    return Asked(messages=[_message(m, i) for i, m in enumerate(body.messages)], tools=[tool_of(t.function) for t in body.tools or []],
                 choice=openai_choice(body.tool_choice), parallel_calls=body.parallel_tool_calls is not False, think=think,
                 effort=body.reasoning_effort, template_kwargs=kwargs, reasoning="none" if body.reasoning_format == "none" else "auto",
                 **_common(body))


def completion_asked(body: CompletionBody) -> Asked:
    """The request a completions body asks for: its prompt (text, or token ids), with a suffix to fill in before."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):  # a list of prompts
        if len(prompt) != 1:
            raise Refused(f"prompt is a list of {len(prompt)} prompts, and localrun answers one a request: send each in a"
                          " request of its own (n asks for several answers to one)", "prompt")
        prompt = prompt[0]
    return Asked(prompt=prompt, suffix=body.suffix, **_common(body))


def _common(body: Union[ChatBody, CompletionBody]) -> dict[str, Any]:
    """What chat and completions bodies both ask: the model and its load, sampling, length, logprobs, the reply."""
    feature = _unsupported(body)
    if feature is not None:
        raise Unsupported(field=feature)
    length = getattr(body, "max_completion_tokens", None) or body.max_tokens
    return dict(model=body.model, keep_alive=body.keep_alive, load=load_options(body.options),
                sampling={name: getattr(body, name) for name in SAMPLING_FIELDS if getattr(body, name) is not None},
                stops=stops_of(body.stop), logit_bias=body.logit_bias, max_tokens=length, ignore_eos=body.ignore_eos,
                draft_max=body.draft_max, lora=body.lora, top_logprobs=_top_logprobs(body), **_response_format(body.response_format),
                reply=Reply(stream=body.stream, n=body.n, usage=bool((body.stream_options or {}).get("include_usage")),
                            progress=body.return_progress))


def _message(m: _Message, i: int) -> Message:
    """A chat message (the developer's as the system's), its images named by their place in the body."""
    thinking = getattr(m, "reasoning_content", None) or getattr(m, "reasoning", None)  # llama.cpp's name, and OpenRouter's
    name = getattr(m, "name", None)
    return Message(role="system" if m.role == "developer" else m.role, text=m.text(),
                   images=[Image(part.url, f"messages.{i}.content.{j}") for j, part in m.image_parts()],
                   calls=[Call(c.function.name, c.function.arguments, c.id) for c in m.tool_calls or []],
                   call_id=m.tool_call_id, name=name if isinstance(name, str) else None,
                   thinking=thinking if isinstance(thinking, str) and thinking else None)


def _top_logprobs(body: Union["ChatBody", "CompletionBody"]) -> Optional[int]:
    """How many alternatives each token's logprobs list (None: no logprobs). Chat: `logprobs: true` with
    `top_logprobs` 0-20; completions: `logprobs` N, 0-20 (OpenAI allows 5 there; llama.cpp's server more)."""
    chat = isinstance(body, ChatBody)
    if chat:
        if body.top_logprobs is not None and not body.logprobs:
            raise Refused("top_logprobs needs logprobs: true", "top_logprobs")
        if not body.logprobs:
            return None
        if body.logprobs is not True:
            raise Refused("logprobs is true or false here (top_logprobs says how many alternatives)", "logprobs")
        n, param = body.top_logprobs or 0, "top_logprobs"
    else:
        if body.top_logprobs is not None:
            raise Refused("top_logprobs is a chat field: here logprobs is the number of alternatives", "top_logprobs")
        if body.logprobs is None or body.logprobs is False:
            return None
        n, param = (0 if body.logprobs is True else body.logprobs), "logprobs"
    return top_logprobs(n, param)


def _response_format(fmt: Optional[dict]) -> dict:
    """response_format as the request's JSON schema or JSON object (llama-server's json_object with a schema too)."""
    if not fmt or fmt.get("type") in (None, "text"):
        return {}
    if fmt.get("type") == "json_object":
        if fmt.get("schema") is not None:  # llama-server's form: a JSON object in that schema
            if not isinstance(fmt["schema"], dict):
                raise Refused("response_format's schema must be a JSON schema object", "response_format")
            return {"json_schema": fmt["schema"]}
        return {"json_object": True}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise Refused("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
        return {"json_schema": schema}
    raise Refused(f"unsupported response_format type {fmt.get('type')!r}: use text, json_object or json_schema", "response_format")



# -- answers -----------------------------------------------------------------------------------------


def openai_calls(calls: list[dict]) -> list[dict]:
    """Calls as OpenAI's tool_calls (arguments as a JSON string, as the model wrote them, each with its id)."""
    return [{"id": c.get("id") or "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": c["name"], "arguments": c.get("raw") or json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


def logprobs_of(facts, chat: bool, entries: Optional[list], offset: int = 0) -> Optional[dict]:
    """OpenAI's logprobs object for these tokens (engine.TokenLogprob; their text from the model's `facts`): chat's
    {"content": [...]} with bytes, or completions' parallel lists; `offset`: where the first token's text starts."""
    if entries is None:
        return None

    def piece(token: int) -> tuple[str, list[int]]:
        raw = facts.token_bytes(token)
        return raw.decode("utf-8", "replace"), list(raw)

    if chat:
        content = []
        for e in entries:
            text, raw = piece(e.token)
            top = []
            for tok, lp in e.top:
                t, b = piece(tok)
                top.append({"token": t, "logprob": lp, "bytes": b})
            content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
        return {"content": content}
    tokens, offsets, tops = [], [], []
    for e in entries:
        text, _ = piece(e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        tops.append({piece(tok)[0]: lp for tok, lp in e.top})
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops, "text_offset": offsets}


def usage(stats: Stats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def timings(stats: Stats) -> dict:
    """The answer's timings; where it was decoded with drafts, what they gave (llama-server's draft_n and
    draft_n_accepted, and the batched steps they took)."""
    drafted = {"draft_n": stats.draft_tokens, "draft_n_accepted": stats.draft_accepted, "steps": stats.target_steps}
    return {"ttft_s": round(stats.ttft_s, 6), "tpot_s": round(stats.tpot_s, 6), **(drafted if stats.target_steps else {})}


def completion(rid: str, chat: bool, model_id: str, text: str, final: Response, logprobs: Optional[dict] = None,
               read: Optional[Callable[[str], tuple[str, list[dict]]]] = None, fingerprint: Optional[str] = None) -> dict:
    """The whole answer; `read`: the text read as (content, calls) in the model's family format; `fingerprint`: what
    answered it (OpenAI's system_fingerprint: the build and the llama.cpp it runs)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH_REASONS[final.finish_reason], "logprobs": logprobs}
    if chat:
        content, calls = read(text) if read is not None else (text, [])
        choice["message"] = {"role": "assistant", "content": content}
        if final.thinking:
            choice["message"]["reasoning_content"] = final.thinking
        if calls:
            choice["message"] = {**choice["message"], "content": content or None, "tool_calls": openai_calls(calls)}
            choice["finish_reason"] = "tool_calls"
    else:
        choice["text"] = text
    return {
        "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": model_id, **({"system_fingerprint": fingerprint} if fingerprint else {}), "choices": [choice],
        "usage": usage(final.stats), "timings": timings(final.stats),
    }


def merged(answers: list[dict], rid: str) -> dict:
    """Several answers to one request (n > 1) as one, each its choice: the prompt counted once, the
    completions' tokens added up."""
    first = answers[0]
    choices = [{**a["choices"][0], "index": i} for i, a in enumerate(answers)]
    completion_tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    used = {**first["usage"], "completion_tokens": completion_tokens,
            "total_tokens": first["usage"]["prompt_tokens"] + completion_tokens}
    return {**first, "id": rid, "choices": choices, "usage": used}


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


async def sse(events: AsyncIterator[Event], rid: str, chat: bool, include_usage: bool, model_id: str, facts=None,
              top_logprobs: Optional[int] = None, progress: bool = False, fingerprint: Optional[str] = None) -> AsyncIterator[str]:
    """An answer's events (serve.stream.answer_events) as OpenAI's server-sent events; `progress`: the prompt's
    progress as llama-server writes it (a chunk with prompt_progress), asked by return_progress; `fingerprint` in
    every chunk, as OpenAI sends it."""
    chunks = _Chunks(rid, chat, include_usage, model_id, fingerprint)
    offset, called = 0, False
    if chat:
        yield chunks.chunk(None, None, role=True)
    async for e in events:
        if e.kind == "ping":  # a long prompt: an SSE comment keeps clients that give up on silence
            yield ": keep-alive\n\n"
        elif e.kind == "progress" and progress:
            yield chunks.progress(e.progress)
        elif e.kind == "thinking" and chat:
            yield chunks.delta({"reasoning_content": e.text})
        elif e.kind == "text":
            logprobs = logprobs_of(facts, chat, e.logprobs, offset) if top_logprobs is not None else None
            offset += len(e.text)
            yield chunks.chunk(e.text, None, logprobs=logprobs)
        elif e.kind == "call":  # a call begins (its id and name), its arguments as far as they are written
            called = True
            yield chunks.delta({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                                "function": {"name": e.name, "arguments": e.text}}]})
        elif e.kind == "call_args":
            yield chunks.delta({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
        elif e.kind == "tool_calls":
            called = True
        elif e.kind == "failed":
            yield _event({"error": {"message": e.text, "type": "server_error", "param": None, "code": None}})
        elif e.kind == "done":
            yield chunks.chunk(None, "tool_calls" if called else FINISH_REASONS[e.final.finish_reason])
            if include_usage:
                yield chunks.event([], usage=usage(e.final.stats), timings=timings(e.final.stats))
            yield "data: [DONE]\n\n"


class _Chunks:
    """One stream's chunks: each with its id, object, creation time and model."""

    def __init__(self, rid: str, chat: bool, include_usage: bool, model_id: str, fingerprint: Optional[str] = None) -> None:
        self.rid, self.chat, self.include_usage, self.model_id, self.fingerprint = rid, chat, include_usage, model_id, fingerprint
        self.created, self.began = int(time.time()), time.monotonic()
        self.kind = "chat.completion.chunk" if chat else "text_completion"

    def event(self, choices: list, **more: Any) -> str:
        return _event({"id": self.rid, "object": self.kind, "created": self.created, "model": self.model_id,
                       **({"system_fingerprint": self.fingerprint} if self.fingerprint else {}), "choices": choices, **more})

    def delta(self, fields: dict) -> str:
        return self.event([{"index": 0, "delta": fields, "finish_reason": None, "logprobs": None}])

    def chunk(self, text: Optional[str], finish: Optional[str], *, role: bool = False, logprobs: Optional[dict] = None) -> str:
        if self.chat:
            fields: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": fields, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        # with include_usage, as OpenAI streams it: null on every chunk, the totals in a last chunk
        return self.event([choice], **({"usage": None} if self.include_usage else {}))

    def progress(self, p) -> str:
        """How far the prompt is, as llama-server writes it (engine.Progress: its tokens, the cached part, those in)."""
        return self.event([{"index": 0, **({"delta": {}} if self.chat else {"text": ""}), "finish_reason": None, "logprobs": None}],
                          prompt_progress={"total": p.total, "cache": p.cached, "processed": p.processed,
                                           "time_ms": round((time.monotonic() - self.began) * 1000, 3)})


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
