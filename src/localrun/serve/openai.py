"""The OpenAI dialect (/v1): request bodies, how a body becomes the runtime Request the request path answers
(`request_for`, which the other dialects' translators reach through ChatBody), and the JSON and SSE answers
written from the answer's events. Errors answer in OpenAI's shape, refusals worded here (`refusal`)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      create_model, model_validator)

from ..errors import ContextOverflow, LocalrunError, SettingError, UsageError
from ..runtime import OptionError, Request, Response, SamplingOptions, Stats, merge_options
from ..runtime.facts import facts_of
from ..runtime.options import DRAFT_MAX, KV_TYPES, OLLAMA_IGNORED, OLLAMA_LOAD
from .errors import ApiError
from .wire import BadJson, parse_json

FINISH_REASONS = {"stop": "stop", "eos": "stop", "length": "length"}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
PING_S = float(os.environ.get("LOCALRUN_PING_S") or 10.0)  # a stream silent this long (a prompt still evaluated) gets a keep-alive


# -- request bodies --------------------------------------------------------------------------------


class _FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")  # strict, ...
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: _FunctionSpec


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
    # Ollama's chat and generate (`truncate`, true by default; set by that dialect): a prompt over the context is
    # cut rather than refused, as Ollama's (the start of its last message goes; a chat template's head stays)
    _truncate: bool = PrivateAttr(False)

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
                    raise ApiError(400, f"invalid {name!r}: a whole number, 0 or more (0: no drafts)", param=name)
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
    # Sent (mostly with their off values) by common clients: accepted when off, refused when asked for.
    logprobs: Union[StrictBool, StrictInt, None] = None
    top_logprobs: Optional[StrictInt] = None
    tools: Optional[list[_Tool]] = None
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


# Every sampling option is a request field too (as in llama.cpp's server), checked where options merge.
_SAMPLING_FIELDS = [name for name in SamplingOptions.model_fields if name not in _Fields.model_fields]
def _strict(annotation):
    """A sampling option's type as a request field: a number must be written as one ("10" is no integer)."""
    return {int: StrictInt, float: StrictFloat, bool: StrictBool}.get(annotation, annotation)


_Body = create_model(
    "_Body", __base__=_Fields,
    **{name: (Optional[_strict(SamplingOptions.model_fields[name].annotation)], None) for name in _SAMPLING_FIELDS},
)


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


class CompletionBody(_Body):
    # OpenAI's API takes a list of prompts too (LangChain's OpenAI LLM always sends one): a list of one is
    # that prompt; several are refused by name (_request).
    prompt: Union[StrictStr, list[StrictInt], list[StrictStr], list[list[StrictInt]]]
    echo: StrictBool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None


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

    def for_template(self) -> dict[str, Any]:
        """As the prompt renderer takes a message (engine.prompt shapes it for the template): a tool call's
        arguments as the client wrote them (checked to be a JSON object), a tool result with the id and name of the
        call it answers, an assistant's earlier thinking (reasoning_content, llama.cpp's name) for the template
        to write back where its model was trained to read it."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _checked(c.function.arguments)}} for c in self.tool_calls]
        thinking = getattr(self, "reasoning_content", None) or getattr(self, "reasoning", None)
        if self.role == "assistant" and isinstance(thinking, str) and thinking:
            out["reasoning_content"] = thinking
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if isinstance(getattr(self, "name", None), str):
                out["name"] = self.name
        return out


def _checked(given: Union[str, dict]) -> Union[str, dict]:
    """A tool call's arguments as given, once known to be a JSON object (a string's text kept: templates that
    write arguments as text then write the client's own, and the prompt stays as it was)."""
    _arguments(given)
    return given if isinstance(given, dict) else (given or "{}")


def _arguments(given: Union[str, dict]) -> dict:
    if isinstance(given, dict):
        return given
    try:
        value = json.loads(given or "{}")
    except ValueError:
        raise ApiError(400, f"a tool call's arguments are not JSON: {given[:80]!r}", param="messages") from None
    if not isinstance(value, dict):
        raise ApiError(400, "a tool call's arguments must be a JSON object", param="messages")
    return value


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    # A reasoning model's thinking: apart in reasoning_content (auto; deepseek, as llama.cpp's server names
    # it), or left inline in the content (none); the template's switch (Qwen3's enable_thinking).
    reasoning_format: Optional[Literal["auto", "deepseek", "none"]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None  # to the template (gpt-oss reads it); "none" turns thinking off
    # Ollama's /api/chat (set by that dialect, no request field): a conversation over the context drops its oldest
    # messages rather than being refused, as OpenAI's API and llama-server refuse it.
    _drop_oldest: bool = PrivateAttr(False)
    # What the body's images are called in errors, in order, where another dialect's translator made the body
    # (Ollama's messages.0.images.0); by default their place here (messages.0.content.1).
    _image_names: list = PrivateAttr(default_factory=list)
    # Ollama's generate `context` (set by that dialect): the tokens of an earlier prompt and answer, before this one
    _context: Optional[list] = PrivateAttr(None)
    # Ollama's /api/chat (set by that dialect): tools for a model whose template has none are a 400, as Ollama's
    # ("does not support tools"); OpenAI's dialect answers them as text, as llama-server does
    _tools_need_support: bool = PrivateAttr(False)


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
        raise ApiError(400, "input must not be empty (nor hold an empty text)", param="input")
    return list(given)


def embeddings_answer(model_id: str, result, encoding_format: str) -> dict:
    import base64
    import struct

    def encoded(vector: list[float]):
        if encoding_format == "base64":  # little-endian float32, as OpenAI sends them
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return vector

    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(result.vectors)],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


def _written(error: dict, data: Any) -> list[bool]:
    """For each part of pydantic's error location, whether the client wrote it: a key or an index into the
    body, or the required field it left out. The rest are the names pydantic gives a union's branches
    (`str`, `list[_Part]`), found by walking the body itself (a heuristic on the names took a client's
    capitalised key for one)."""
    node, written = data, []
    loc = error["loc"]
    for i, part in enumerate(loc):
        # a tagged union's branch is named by its tag ('text' of {"type": "text", ...}), which may be a key too:
        # the branch when what follows is another key of the same object ({"type": "text", "text": .., "foo": 1})
        tag = isinstance(node, dict) and node.get("type") == part and i + 1 < len(loc) and loc[i + 1] in node
        if isinstance(node, dict) and part in node and not tag:
            node = node[part]
        elif isinstance(node, list) and type(part) is int and 0 <= part < len(node):
            node = node[part]
        elif not (error["type"] == "missing" and i == len(error["loc"]) - 1):
            written.append(False)
            continue
        written.append(True)
    return written


def validation_error(exc: ValidationError, data: Any, name_of: Callable[[str], str] = str) -> ApiError:
    """400 for the first field of `data` (the body validated) that failed, named as the client wrote its
    path (`name_of`: as another dialect's client wrote what was translated into it). Where that field is a
    union (a message's content: text or a list of parts), the branch that got furthest says what is wrong."""
    errors = exc.errors()
    first = errors[0]
    branch = next((i for i, ok in enumerate(_written(first, data)) if not ok), None)
    if branch is not None:
        same = [e for e in errors if e["loc"][:branch] == first["loc"][:branch]]
        first = max(same, key=lambda e: len(e["loc"]))  # the first of the deepest
    where = name_of(".".join(str(p) for p, ok in zip(first["loc"], _written(first, data)) if ok))
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"unknown or unsupported field {where!r}", param=where)
    if first["type"] == "missing":
        return ApiError(400, f"missing required field {where!r}", param=where)
    return ApiError(400, f"invalid {where!r}: {first['msg'].removeprefix('Value error, ')}", param=where)


def parse_body(raw: bytes, kind: type[BaseModel]) -> Any:
    try:
        data = parse_json(raw)
    except BadJson as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None


# -- a body becomes a job --------------------------------------------------------------------------


def refusal(exc: BaseException, chat: bool, more_context: str = "restart the server with a larger --ctx",
            name_of: Callable[[str], str] = str) -> "ApiError":
    """Why the request path did not take a request (runtime.generate refused it before its first token),
    as an error in this dialect's terms: the body's fields named (`name_of`: as the client wrote a field
    translated into the body), the numbers given. `more_context`: how a client of this dialect gets a
    larger context (Ollama's: options.num_ctx, Open WebUI's Context Length)."""
    from ..runtime.scheduler import QueueFull, ServerStopping

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflow):
        # OpenAI's own words lead (clients such as litellm tell a context overflow by them, to trim or fall back);
        # Anthropic's translator words it as Anthropic does (context_overflow)
        error = ApiError(400, f"This model's maximum context length is {exc.n_ctx} tokens (a slot's context), but the prompt is"
                              f" {exc.n_prompt} tokens: shorten it, or {more_context}",
                         param="messages" if chat else "prompt", code="context_length_exceeded")
        error.sizes = (exc.n_prompt, exc.n_ctx)
        return error
    if isinstance(exc, QueueFull):
        return ApiError(429, exc.message, type_="rate_limit_error", code="queue_full")
    if isinstance(exc, ServerStopping):  # a scheduler that failed says why
        return ApiError(503, exc.failure or "the server is shutting down: retry later", type_="server_error")
    if isinstance(exc, OptionError):
        return ApiError(400, f"invalid {name_of(exc.field)!r}: {exc.reason}" if exc.field else exc.reason, param=exc.field)
    from ..runtime.images import BadImage, NoProjector

    if isinstance(exc, BadImage):
        return ApiError(400, exc.message, param=exc.name, code="invalid_image")
    if isinstance(exc, NoProjector):
        return ApiError(400, f"{exc.image}: the model {exc.model} has no image projector: start the server with"
                             " --mmproj FILE for it, or put its mmproj-*.gguf beside the model file", param=exc.image,
                        code="model_without_vision")
    if isinstance(exc, UsageError):
        return ApiError(400, exc.message)
    if isinstance(exc, LocalrunError):
        return ApiError(500, exc.message, type_="server_error")
    # e.g. a chat template that raises on these messages
    return ApiError(400, f"cannot build the prompt: {type(exc).__name__}: {exc}")


def request_for(resident, body: Union[CompletionBody, ChatBody]) -> tuple[Request, Optional["ToolMode"]]:
    """The runtime request a body asks of a resident model (see runtime.pool), and how its tools are read in
    the answer; 400 naming the field for what cannot be served. The prompt is made on the request path."""
    feature = _unsupported(body)
    if feature is not None:
        raise ApiError(400, f"{feature!r} is not supported by localrun serve: leave it out", param=feature)
    engine = facts_of(resident)
    chat = isinstance(body, ChatBody)
    request, tooling = _request(engine, body)
    request.drop_oldest = chat and body._drop_oldest
    request.truncate = body._truncate
    if chat and body._context:
        bad = [t for t in body._context if not 0 <= t < engine.n_vocab]
        if bad:
            raise ApiError(400, f"context holds token id {bad[0]}, out of this model's range 0..{engine.n_vocab - 1}: send the"
                                " context an answer of this model gave", param="context")
        request.context = list(body._context)
    options = _options(resident.loaded.sampling, body)
    if tooling is not None and (tooling.forced is not None or tooling.grammar is not None):
        if options.grammar is not None:
            raise ApiError(400, "tool_choice required (or a named function) cannot combine with a grammar", param="tool_choice")
        # A forced call writes no text for a response format to shape: the call's own grammar decodes it, as OpenAI
        # takes the pair (instructor's RESPONSES_TOOLS mode sends both).
        forced = {"json_schema": tooling.forced} if tooling.forced is not None else {"grammar": tooling.grammar, "json_schema": None}
        options = options.model_copy(update={**forced, "stop": []})  # the grammar ends the call whole
    asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if asked is not None:
        options = options.model_copy(update={"max_tokens": asked})
    elif options.max_tokens <= 0 or "max_tokens" not in resident.loaded.sampling.model_fields_set:
        # Unasked and unset (no `serve -n`, catalogue or Modelfile length): until the slot is full, as OpenAI's,
        # Ollama's and llama-server's are; the command line's 512 was cutting agents' answers (Codex sends none).
        options = options.model_copy(update={"max_tokens": -1})
    if body.ignore_eos:
        if options.grammar is not None or options.json_schema is not None:
            raise ApiError(400, "ignore_eos cannot combine with response_format (the grammar decides where the text ends)", param="ignore_eos")
        options = options.model_copy(update={"min_tokens": options.max_tokens if options.max_tokens > 0 else MAX_LENGTH})
    _check_sampler(engine, options, "tool_choice" if tooling is not None and (tooling.forced or tooling.grammar) else "response_format")
    request.sampling = options
    request.top_logprobs = _top_logprobs(body)
    request.draft_max = body.draft_max
    return request, tooling


MAX_LENGTH = 10_000_000  # the longest answer an option may ask for (options.SAMPLING's bound)


def _check_sampler(engine, options: SamplingOptions, schema_from: str) -> None:
    """What the sampler chain would refuse, named as the body's field before the request is queued: token ids
    outside this model's vocabulary, a JSON schema the grammar converter cannot express."""
    from ..runtime import SchemaError, check_bias_tokens, json_schema_grammar

    try:
        check_bias_tokens(options.logit_bias, engine.n_vocab)
    except OptionError as exc:
        raise ApiError(400, f"invalid logit_bias: {exc.reason}", param="logit_bias") from None
    if options.json_schema is not None:
        try:
            json_schema_grammar(options.json_schema)
        except SchemaError as exc:
            raise ApiError(400, f"the JSON schema cannot be followed: {exc}", param=schema_from) from None


def _request(engine, body: Union[CompletionBody, ChatBody]) -> tuple[Request, Optional["ToolMode"]]:
    """The request a body asks for (messages, tools, the thinking switch; or a prompt), and how its tools
    are served."""
    tooling = None
    if isinstance(body, ChatBody):
        tooling = tool_mode(engine, body)
        kwargs = dict(body.chat_template_kwargs or {})
        if not isinstance(kwargs.get("enable_thinking", True), bool):
            raise ApiError(400, "chat_template_kwargs.enable_thinking must be true or false", param="chat_template_kwargs")
        think = kwargs.pop("enable_thinking", None)
        effort = body.reasoning_effort
        if effort is not None:  # the template reads it (gpt-oss's reasoning_effort); "none": no thinking, as llama.cpp takes it
            if effort not in REASONING_EFFORTS:
                raise ApiError(400, f"invalid reasoning_effort {effort!r}: one of {', '.join(REASONING_EFFORTS)}", param="reasoning_effort")
            kwargs.setdefault("reasoning_effort", effort)
            if effort == "none" and think is None:
                think = False
        request = Request(messages=_with_images(body),
                          tools=[t.model_dump(exclude_none=True) for t in body.tools] if tooling else None,
                          think=think, reasoning="none" if body.reasoning_format == "none" else "auto", template_kwargs=kwargs)
        return request, tooling
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):  # a list of prompts
        if len(prompt) != 1:
            raise ApiError(400, f"prompt is a list of {len(prompt)} prompts, and localrun answers one a request: send "
                                "each in a request of its own (n asks for several answers to one)", param="prompt")
        prompt = prompt[0]
    if body.suffix:  # fill in the middle: what goes between the prompt and the suffix (code completion in editors)
        if not isinstance(prompt, str):
            raise ApiError(400, "suffix needs the prompt as text (the code before the cursor)", param="suffix")
        tokens = engine.infill_tokens(prompt, body.suffix)
        if tokens is None:
            raise ApiError(400, f"{engine.file_name} has no fill-in-the-middle tokens, so it cannot fill in between a prompt and"
                                " a suffix: use a code model that has them (Qwen2.5-Coder, CodeLlama, StarCoder, ...)", param="suffix")
        return Request(tokens=tokens), tooling
    if not prompt:
        raise ApiError(400, "prompt is empty: give it some text or token ids", param="prompt")
    if isinstance(prompt, list):
        bad = [t for t in prompt if not 0 <= t < engine.n_vocab]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is out of range: this model's ids run 0..{engine.n_vocab - 1}", param="prompt")
        return Request(tokens=list(prompt)), tooling
    return Request(messages=[{"role": "user", "content": prompt}], raw=True), tooling


def _with_images(body: ChatBody) -> list[dict]:
    """The body's messages as templates read them, each message's images (runtime.images: decoded from
    their data: URLs, named as the client wrote them) beside its text; the prompt puts them before it."""
    from ..runtime.images import image_from_url

    messages, k = [], 0
    for i, m in enumerate(body.messages):
        out = m.for_template()
        images = []
        for j, part in m.image_parts():
            name = body._image_names[k] if k < len(body._image_names) else f"messages.{i}.content.{j}"
            images.append(image_from_url(part.url, name))
            k += 1
        if images:
            out["images"] = images
        messages.append(out)
    return messages


def prompt_tokens(resident, body: ChatBody) -> int:
    """How many tokens the prompt of `body` is for this model, whether it fits a slot or not (with the
    model's default system prompt where the body has none, as it is answered)."""
    facts = facts_of(resident)
    request, _ = _request(facts, body)
    return facts.prompt_length(request)


MAX_TOP_LOGPROBS = 20


@dataclass
class ToolMode:
    """A chat request with tools the model may call: the reader of the model's family (runtime.parser_for, with
    the tools offered), the names of the tools, how a forced call is generated (tool_choice required or a named
    function: a grammar in the family's own format, or else the generic JSON call's schema), whether several
    calls may come back, and the ids the template demands (Mistral's: 9 letters and digits)."""

    parser: Any
    names: frozenset = frozenset()
    forced: Optional[dict] = None
    grammar: Optional[str] = None
    parallel: bool = True
    nine_char_ids: bool = False

    def calls_in(self, text: str) -> tuple[str, list[dict]]:
        """(content, calls) of a whole answer."""
        message = self.parser.read(text)
        return self._kept(message.content, [self.call(c) for c in message.calls])

    def call(self, call) -> dict:
        """A call read from the answer (formats.ToolCall) as the dialects take it: {"id", "name", "arguments":
        object, "raw": the arguments' JSON text as written}."""
        arguments = json.loads(call.arguments or "{}")
        return {"id": call.id if call.id and not self.nine_char_ids else self.new_id(), "name": call.name,
                "arguments": arguments, "raw": call.arguments or "{}"}

    def new_id(self) -> str:
        if self.nine_char_ids:
            return uuid.uuid4().hex[:9]
        return "call_" + uuid.uuid4().hex[:24]

    def _kept(self, content: str, calls: list[dict]) -> tuple[str, list[dict]]:
        # A forced call cut short (max_tokens) before one was whole is no answer: its JSON was the grammar's
        # form of a call, not text for the client (it came back as content; found by a helper).
        if (self.forced is not None or self.grammar is not None) and not calls:
            return "", []
        return content, (calls if self.parallel else calls[:1])

    def stream(self):
        """The answer read as it streams (runtime.AnswerStream): its deltas."""
        from ..runtime import AnswerStream

        return AnswerStream(self.parser)


_warned_templates: set = set()


def tool_mode(engine, body: "ChatBody") -> Optional[ToolMode]:
    """How a chat request's tools are served, or None when there are none to offer (none given, or
    tool_choice "none"). 400 when a call is required of a template that cannot render tools."""
    from ..runtime import call_schema, family_for, forced_grammar, parser_for, supports_tools

    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if not body.tools:
        if choice not in ("none", "auto"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    names = [t.function.name for t in body.tools]
    offered = list(body.tools)
    named = None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        # OpenAI's allowed_tools: every tool stays in the prompt (its cache with it), only these may be called
        spec = choice.get("allowed_tools")
        mode, allowed = (spec.get("mode", "auto"), spec.get("tools")) if isinstance(spec, dict) else (None, None)
        if mode not in ("auto", "required") or not isinstance(allowed, list) or not allowed:
            raise ApiError(400, "tool_choice allowed_tools needs {'mode': 'auto' or 'required', 'tools': [{'type': 'function',"
                                " 'function': {'name': ...}}, ...]}", param="tool_choice")
        wanted = {(t.get("function") or {}).get("name") if isinstance(t, dict) else None for t in allowed}
        if not wanted <= set(names):
            raise ApiError(400, f"tool_choice allowed_tools names a tool not given: use some of {', '.join(names)}", param="tool_choice")
        offered = [t for t in body.tools if t.function.name in wanted]
        names, choice = [t.function.name for t in offered], mode
    elif isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if named not in names:
            raise ApiError(400, f"tool_choice names no given tool: use one of {', '.join(names)}", param="tool_choice")
    template = engine.chat_template
    # A family with a format of its own is read for calls even where its template does not describe the tools (DeepSeek
    # V3.1 and R1's: the client describes them in its system prompt), as llama.cpp reads them.
    if not supports_tools(template) and family_for(template).calls is None:
        if body._tools_need_support:
            raise ApiError(400, f"{body.model or engine.file_name} does not support tools (its chat template has none): leave"
                                " tools out, or use a model that has them (/api/show lists \"tools\" in its capabilities)", param="tools")
        if choice == "auto":
            if (engine.path, template) not in _warned_templates:
                _warned_templates.add((engine.path, template))
                print(f"notice: {engine.file_name}'s chat template has no tool support: requests with tools are answered as text",
                      file=sys.stderr, flush=True)
            return None
        raise ApiError(400, f"{engine.file_name}'s chat template cannot render tools, so a tool call cannot be required of it"
                       " (use tool_choice auto, or a model whose template has tools)", param="tool_choice")
    parallel = body.parallel_tool_calls is not False
    tools = [t.model_dump(exclude_none=True) for t in offered]
    parser = parser_for(template, tools=[t.model_dump(exclude_none=True) for t in body.tools], parallel=parallel,
                        reasoning="none" if body.reasoning_format == "none" else "auto", forced=bool(named or choice == "required"))
    parser.tools = parser.tools.only(names)
    mode = ToolMode(parser, frozenset(names), parallel=parallel, nine_char_ids="length != 9" in template)
    if named or choice == "required":
        # Forced: one call (a named function, or parallel_tool_calls false), else one or more; in the family's own
        # format where it has one (what the model was trained to write), else as the generic JSON call.
        several = parallel and named is None
        thinking = (body.chat_template_kwargs or {}).get("enable_thinking") is not False and body.reasoning_effort != "none"
        mode.grammar = forced_grammar(parser.family, tools, named, several, think=thinking)
        if mode.grammar is None:
            mode.forced = call_schema(tools, named, parallel=several)
    return mode


def openai_calls(calls: list[dict]) -> list[dict]:
    """Calls as OpenAI's tool_calls (arguments as a JSON string, as the model wrote them, each with its id)."""
    return [{"id": c.get("id") or "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": c["name"], "arguments": c.get("raw") or json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


def _top_logprobs(body) -> Optional[int]:
    """How many alternatives each token's logprobs list (None: no logprobs). Chat: `logprobs: true` with
    `top_logprobs` 0-20; completions: `logprobs` N, 0-20 (OpenAI allows 5 there; llama.cpp's server more)."""
    chat = isinstance(body, ChatBody)
    if chat:
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if not body.logprobs:
            return None
        if body.logprobs is not True:
            raise ApiError(400, "logprobs is true or false here (top_logprobs says how many alternatives)", param="logprobs")
        n, param = body.top_logprobs or 0, "top_logprobs"
    else:
        if body.top_logprobs is not None:
            raise ApiError(400, "top_logprobs is a chat field: here logprobs is the number of alternatives", param="top_logprobs")
        if body.logprobs is None or body.logprobs is False:
            return None
        n, param = (0 if body.logprobs is True else body.logprobs), "logprobs"
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"{param} must be 0 to {MAX_TOP_LOGPROBS}", param=param)
    return n


def logprobs_of(engine, chat: bool, entries: list, offset: int = 0) -> Optional[dict]:
    """OpenAI's logprobs object for these tokens (engine.TokenLogprob): chat's {"content": [...]} with bytes,
    or completions' parallel lists; `offset`: where the first token's text starts in the answer."""
    if entries is None:
        return None

    def piece(token: int) -> tuple[str, list[int]]:
        raw = engine.token_bytes(token)
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


# Ollama's names for the load-time options (api.Runner), plus localrun's for the KV cache and flash attention.
_LOAD_FIELDS = {**OLLAMA_LOAD, "num_parallel": "parallel", "kv_type": "kv_type", "flash_attn": "flash_attn"}


def load_spec(base, options: Optional[dict[str, Any]]):
    """The server's load options with a request's `options` over them; 400 naming a bad one."""
    from dataclasses import replace

    if not options:
        return base
    unknown = sorted(set(options) - set(_LOAD_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown load option {unknown[0]!r}: use {', '.join(_LOAD_FIELDS)}", param=f"options.{unknown[0]}")
    update = {}
    for name, value in options.items():
        field = _LOAD_FIELDS[name]
        ok = {"kv_type": lambda v: v in KV_TYPES, "flash_attn": lambda v: v is None or isinstance(v, bool),
              "gpu_layers": lambda v: isinstance(v, int) and not isinstance(v, bool) or v == "auto"}.get(
            field, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
        if not ok(value):
            raise ApiError(400, f"invalid options.{name} {value!r}", param=f"options.{name}")
        update[field] = str(value) if field == "gpu_layers" else value
    spec = replace(base, **update)
    try:
        spec.check()  # before any model is touched: a bad value never unloads the one in use
    except SettingError as exc:  # named as the request names it
        named = {setting: f"options.{option}" for option, setting in _LOAD_FIELDS.items()}
        raise ApiError(400, exc.worded(lambda setting: named.get(setting, setting)),
                       param=named.get(exc.setting, "options")) from None
    except LocalrunError as exc:  # e.g. an RPC endpoint or a tensor split: the server's own settings
        raise ApiError(400, exc.message, param="options") from None
    return spec


def _options(base: SamplingOptions, body) -> SamplingOptions:
    """The server's options (the catalogue's and serve's flags), then the request's own fields: its stops and
    logit biases add to the server's."""
    update: dict[str, Any] = {name: getattr(body, name) for name in _SAMPLING_FIELDS}
    seed = update.get("seed")
    if isinstance(seed, int) and not -1 <= seed < 2**32 - 1 and -2**63 <= seed < 2**63:
        update["seed"] = seed % (2**32 - 1)  # OpenAI's seeds are 64-bit, llama.cpp's 32 (its last value, random)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(s == "" for s in stops):
        raise ApiError(400, "a stop sequence cannot be empty", param="stop")
    update["stop"] = list(dict.fromkeys([*base.stop, *stops]))
    if body.logit_bias is not None:
        update["logit_bias"] = {**base.logit_bias, **body.logit_bias}
    update.update(_response_format(body.response_format))
    return merge_options(base.model_dump(), update)  # OptionError: worded by `refusal`, the field as the client named it


def _response_format(fmt: Optional[dict]) -> dict:
    if not fmt or fmt.get("type") in (None, "text"):
        return {}
    if fmt.get("type") == "json_object":
        if fmt.get("schema") is not None:  # llama-server's form: a JSON object in that schema
            if not isinstance(fmt["schema"], dict):
                raise ApiError(400, "response_format's schema must be a JSON schema object", param="response_format")
            return {"json_schema": fmt["schema"]}
        from ..runtime.options import json_grammar

        return {"grammar": json_grammar()}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}", param="response_format")
        return {"json_schema": schema}
    raise ApiError(400, f"unsupported response_format type {fmt.get('type')!r}: use text, json_object or json_schema", param="response_format")


# -- answers -----------------------------------------------------------------------------------------


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
               read: Optional[Callable[[str], tuple[str, list[dict]]]] = None) -> dict:
    """The whole answer; `read`: the text read as (content, calls) in the model's family format."""
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
        "model": model_id, "choices": [choice], "usage": usage(final.stats), "timings": timings(final.stats),
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


async def sse(events, rid: str, chat: bool, include_usage: bool, model_id: str, engine=None,
              top_logprobs: Optional[int] = None, progress: bool = False) -> AsyncIterator[str]:
    """An answer's events (serve.stream.answer_events) as OpenAI's server-sent events; `progress`: the prompt's
    progress as llama-server writes it (a chunk with prompt_progress), asked by return_progress."""
    created = int(time.time())
    began = time.monotonic()
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list, **more: Any) -> str:
        return _event({"id": rid, "object": kind, "created": created, "model": model_id, "choices": choices, **more})

    def delta(fields: dict) -> str:
        return event([{"index": 0, "delta": fields, "finish_reason": None, "logprobs": None}])

    def chunk(text: Optional[str], finish: Optional[str], *, role: bool = False, logprobs: Optional[dict] = None) -> str:
        if chat:
            fields: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": fields, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        # with include_usage, as OpenAI streams it: null on every chunk, the totals in a last chunk
        return event([choice], **({"usage": None} if include_usage else {}))

    offset, called = 0, False
    if chat:
        yield chunk(None, None, role=True)
    async for e in events:
        if e.kind == "ping":  # a long prompt: an SSE comment keeps clients that give up on silence
            yield ": keep-alive\n\n"
        elif e.kind == "progress":
            if progress:
                p = e.progress
                yield event([{"index": 0, **({"delta": {}} if chat else {"text": ""}), "finish_reason": None, "logprobs": None}],
                            prompt_progress={"total": p.total, "cache": p.cached, "processed": p.processed,
                                             "time_ms": round((time.monotonic() - began) * 1000, 3)})
        elif e.kind == "thinking":
            if chat:
                yield delta({"reasoning_content": e.text})
        elif e.kind == "text":
            logprobs = logprobs_of(engine, chat, e.logprobs, offset) if top_logprobs is not None else None
            offset += len(e.text)
            yield chunk(e.text, None, logprobs=logprobs)
        elif e.kind == "call":  # a call begins (its id and name), its arguments as far as they are written
            called = True
            yield delta({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                         "function": {"name": e.name, "arguments": e.text}}]})
        elif e.kind == "call_args":
            yield delta({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
        elif e.kind == "tool_calls":
            called = True
        elif e.kind == "failed":
            yield _event({"error": {"message": e.text, "type": "server_error", "param": None, "code": None}})
        elif e.kind == "done":
            yield chunk(None, "tool_calls" if called else FINISH_REASONS[e.final.finish_reason])
            if include_usage:
                yield event([], usage=usage(e.final.stats), timings=timings(e.final.stats))
            yield "data: [DONE]\n\n"


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_answer(exc: ApiError, model: Optional[str] = None) -> tuple[int, dict]:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return exc.status, exc.body()
