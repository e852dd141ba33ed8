"""What the dialects' translators share in checking a body, written once: the settings every dialect passes on
(the model, the length, the sampling options: `settings`, strict as OpenAI's API is), pydantic's errors as
refusals naming the field as the client wrote its path (`refusal_of`), a function tool's spec, the load options
of Ollama's `options` object (which /v1 takes too) and how a request names them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      create_model)

from ..runtime import SamplingOptions
from ..runtime.options import DRAFT_MAX, KV_TYPES, LOAD_OPTIONS
from .asked import Tool, ToolChoice
from .errors import InvalidField, MissingField, Refused, UnknownField

MAX_TOP_LOGPROBS = 20


def need(cond: bool, message: str, field: Optional[str] = None) -> None:
    """A 400 naming what is wrong with the body, unless `cond`."""
    if not cond:
        raise Refused(message, field)


# -- pydantic's errors as refusals ------------------------------------------------------------------


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


def refusal_of(exc: ValidationError, data: Any, prefix: str = "") -> Refused:
    """The refusal for the first field of `data` (the body validated) that failed, its path as the client wrote it
    (after `prefix`). Where that field is a union (a message's content: text or a list of parts), the branch that
    got furthest says what is wrong."""
    errors = exc.errors()
    first = errors[0]
    branch = next((i for i, ok in enumerate(_written(first, data)) if not ok), None)
    if branch is not None:
        same = [e for e in errors if e["loc"][:branch] == first["loc"][:branch]]
        first = max(same, key=lambda e: len(e["loc"]))  # the first of the deepest
    where = prefix + ".".join(str(p) for p, ok in zip(first["loc"], _written(first, data)) if ok)
    if first["type"] == "extra_forbidden":
        return UnknownField(field=where)
    if first["type"] == "missing":
        return MissingField(field=where)
    return InvalidField(first["msg"].removeprefix("Value error, "), where)


def validated(kind: type[BaseModel], data: Any, prefix: str = "") -> Any:
    """`data` as `kind`, or the refusal naming its first bad field."""
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise refusal_of(exc, data, prefix) from None


# -- the settings every dialect passes on -----------------------------------------------------------


def strict(annotation):
    """A sampling option's type as a request field: a number must be written as one ("10" is no integer)."""
    return {int: StrictInt, float: StrictFloat, bool: StrictBool}.get(annotation, annotation)


class _Shared(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[StrictStr] = None
    keep_alive: Union[StrictInt, StrictFloat, StrictStr, None] = None
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    stop: Union[StrictStr, list[StrictStr], None] = None
    logit_bias: Optional[dict[int, float]] = None
    draft_max: Optional[StrictInt] = Field(None, ge=0, le=DRAFT_MAX)
    top_logprobs: Optional[StrictInt] = None
    stream: StrictBool = False
    parallel_tool_calls: Optional[StrictBool] = None
    reasoning_effort: Optional[str] = None


# Every sampling option is a request field too (as in llama.cpp's server), checked where options merge.
SAMPLING_FIELDS = tuple(name for name in SamplingOptions.model_fields if name not in _Shared.model_fields)
Settings = create_model("Settings", __base__=_Shared, **{
    name: (Optional[strict(SamplingOptions.model_fields[name].annotation)], None) for name in SAMPLING_FIELDS})


def settings(given: dict[str, Any]) -> dict[str, Any]:
    """`given` (localrun's names: Settings' fields) checked, each value of its type; the refusal names the first bad one."""
    checked = validated(Settings, given)
    return {name: getattr(checked, name) for name in given}


def sampling_of(values: dict[str, Any]) -> dict[str, Any]:
    """The sampling options among checked settings, those set."""
    return {name: values[name] for name in SAMPLING_FIELDS if values.get(name) is not None}


def stops_of(stop: Union[str, list, None]) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def top_logprobs(n: Any, field: str) -> int:
    """How many alternatives each token's logprobs list, 0 to 20 (OpenAI allows 5 for completions; llama.cpp more)."""
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise Refused(f"{field} must be 0 to {MAX_TOP_LOGPROBS}", field)
    return n


# -- tools ------------------------------------------------------------------------------------------


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")  # strict, ...: for the template
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None


class FunctionTool(BaseModel):
    """A tool as OpenAI's API writes it (Ollama's /api/chat takes the same)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


def tool_of(spec: FunctionSpec) -> Tool:
    return Tool(spec.model_dump(exclude_none=True))


def openai_choice(choice: Union[str, dict, None]) -> ToolChoice:
    """OpenAI's tool_choice (which Ollama's clients send too): auto, none, required; a named function; or
    allowed_tools (only those may be called, all offered)."""
    if choice is None or isinstance(choice, str):
        need(choice in (None, "none", "auto", "required"), "tool_choice is none, auto, required or an object", "tool_choice")
        return ToolChoice(choice or "auto")
    need(isinstance(choice, dict), "tool_choice is none, auto, required or an object", "tool_choice")
    if choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools")
        mode, allowed = (spec.get("mode", "auto"), spec.get("tools")) if isinstance(spec, dict) else (None, None)
        wanted = [_function_name(t) for t in allowed] if isinstance(allowed, list) else []
        return ToolChoice(str(mode), allowed=tuple(wanted))
    return ToolChoice("function", name=_function_name(choice) if choice.get("type") == "function" else None)


def _function_name(tool: Any) -> Optional[str]:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def function_tools(tools: Any, runs_here: Callable[[dict], bool], schema_key: str) -> list[Tool]:
    """A dialect's tools: those `runs_here(tool)` says are the client's own functions; the rest (web_search and
    other tools the dialect's own service runs) are left out, as nothing here can run them."""
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
        spec = {"name": t["name"], "description": t.get("description") or "", "parameters": schema}
        out.append(tool_of(validated(FunctionSpec, spec, f"tools.{i}.")))
    return out


# -- Ollama's `options` object: load options, which /v1 takes too ------------------------------------

_SETTING_OPTION = {setting: option for option, setting in LOAD_OPTIONS.items()}


def load_options(options: Optional[dict[str, Any]]) -> dict[str, Any]:
    """A request's `options` (Ollama's names) as LoadSpec's fields; a refusal naming a bad one."""
    update: dict[str, Any] = {}
    unknown = sorted(set(options or {}) - set(LOAD_OPTIONS))
    if unknown:
        raise Refused(f"unknown load option {unknown[0]!r}: use {', '.join(LOAD_OPTIONS)}", f"options.{unknown[0]}")
    for name, value in (options or {}).items():
        setting = LOAD_OPTIONS[name]
        ok = {"kv_type": lambda v: v in KV_TYPES, "flash_attn": lambda v: v is None or isinstance(v, bool),
              "gpu_layers": lambda v: isinstance(v, int) and not isinstance(v, bool) or v == "auto"}.get(
            setting, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
        if not ok(value):
            raise Refused(f"invalid options.{name} {value!r}", f"options.{name}")
        update[setting] = str(value) if setting == "gpu_layers" else value
    return update


def options_name(field: str) -> str:
    """A load setting (`load.SETTING`, or `load` for them all) as a request's `options` names it; any other field as it is."""
    if field == "load":
        return "options"
    if field.startswith("load."):
        setting = field.removeprefix("load.")
        return f"options.{_SETTING_OPTION.get(setting, setting)}"
    return field
