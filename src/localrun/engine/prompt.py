"""The one prompt renderer: messages to the text a model reads.

With a chat template, the model's own, always rendered as llama.cpp's --jinja renders it (render_template):
in a Jinja sandbox that behaves as llama.cpp's own engine (loop controls, templates changing their own lists
and dicts, undefined values that stay undefined), with the variables it passes, and the messages shaped as
each template takes them (what it takes found once per template by rendering probes, as llama.cpp's caps.cpp:
tool-call arguments as objects or JSON text, ids, a system message it has no place for, reasoning). Without a
template (a base model), either the messages' text as it is (`raw`: `run`'s plain completion) or a plain
transcript that a stop at the next "User:" ends (chat and the server's chat endpoint).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Callable, ItemsView, KeysView, Sequence, ValuesView
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from types import GeneratorType
from typing import Any, Optional

import jinja2
import jinja2.ext
from jinja2.sandbox import SandboxedEnvironment

from ..errors import EngineError, Phrase, TemplateError

TRANSCRIPT_STOP = "\nUser:"


@dataclass
class Rendered:
    text: str
    stops: list[str] = field(default_factory=list)  # stops the format itself needs (the transcript's)
    templated: bool = True


def render(engine, messages: Sequence[dict], *, raw: bool = False, add_generation_prompt: bool = True,
           tools: Optional[list[dict[str, Any]]] = None, think: Optional[bool] = None,
           kwargs: Optional[dict[str, Any]] = None) -> Rendered:
    """`raw`: no template, the messages' contents joined (a system message only when raw was asked for
    rather than forced by a missing template is the caller's choice: it passes the messages it wants).
    `think`: turn a reasoning model's thinking on or off where its template has a switch (Qwen3's
    enable_thinking); None leaves llama-server's default (on). `kwargs`: a request's chat_template_kwargs.
    A conversation that ends with the assistant's own text (a client's "continue", a prefilled answer) is
    continued: that message is the end of the prompt, without its end-of-turn and no new turn opened, as
    Ollama and llama.cpp's server render it."""
    if raw:
        return Rendered("\n\n".join(m["content"] for m in messages), templated=False)
    continued = add_generation_prompt and _continues(messages)
    if engine.chat_template is None:
        text = transcript(messages, add_generation_prompt and not continued)
        return Rendered(text.removesuffix("\n") if continued else text, [TRANSCRIPT_STOP], templated=False)
    if continued:
        return Rendered(_continuation(engine, messages, tools, think, kwargs))
    return Rendered(apply_template(engine, messages, add_generation_prompt, tools, think, kwargs))


def _continues(messages: Sequence[dict]) -> bool:
    """Does the conversation end with an assistant's text to go on with (not a tool call, not empty)."""
    if not messages:
        return False
    last = messages[-1]
    return last["role"] == "assistant" and bool(last.get("content")) and not last.get("tool_calls")


def _continuation(engine, messages: Sequence[dict], tools, think, kwargs=None) -> str:
    """The conversation rendered whole (no generation prompt), cut right after the last message's text: what
    llama.cpp's server does for a prefilled assistant message. A template that rewrites that text (so it
    is not found as written) gets the turn opened as for a new answer, with the text after it."""
    text = apply_template(engine, messages, False, tools, think, kwargs)
    content = messages[-1]["content"]
    at = text.rfind(content)
    if at >= 0:
        return text[:at + len(content)]
    return apply_template(engine, messages[:-1], True, tools, think, kwargs) + content


def transcript(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """A plain 'User: ... / Assistant: ...' transcript for a model without a chat template."""
    parts = []
    for m in messages:
        if m["role"] == "system":
            parts.append(m["content"] + "\n\n")
        elif m["role"] == "user":
            parts.append(f"User: {m['content']}\n")
        else:
            parts.append(f"Assistant: {m['content']}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


def apply_template(engine, messages: Sequence[dict], add_generation_prompt: bool = True,
                   tools: Optional[list[dict[str, Any]]] = None, think: Optional[bool] = None,
                   kwargs: Optional[dict[str, Any]] = None) -> str:
    """The model's own chat template, rendered for every prompt as llama.cpp's `--jinja` renders it
    (render_template: the messages shaped as the template expects them, the same variables); a BOS the
    template writes is left to the tokenizer where it adds one. `kwargs`: a request's chat_template_kwargs
    (reasoning_effort, ...); `think` is its enable_thinking."""
    template = engine.chat_template
    if template is None:
        raise EngineError(Phrase("this model has no chat template: use {raw} for plain completion"))
    extra = dict(kwargs or {})
    if think is not None:
        extra["enable_thinking"] = think
    bos, eos = _special_texts(engine)
    text = render_template(template, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                           bos_token=bos, eos_token=eos, **extra)
    if bos and engine.add_bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def _special_texts(engine) -> tuple[str, str]:
    info = engine.info
    bos = engine.detokenize([info.bos_token_id]) if info.bos_token_id is not None else ""
    eos = engine.detokenize([info.eos_token_id]) if info.eos_token_id is not None else ""
    return bos, eos


def render_template(template: str, messages: Sequence[dict], *, tools: Optional[list[dict[str, Any]]] = None,
                    add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "", **kwargs: Any) -> str:
    """`messages` rendered by the chat template `template` as llama.cpp renders them (common_chat_templates_apply):
    in the template's own Jinja (compiled once), the messages first shaped as this template takes them
    (template_caps: found by rendering probes once per template), with the variables llama.cpp passes:
    messages, tools (when there are any), add_generation_prompt, bos_token, eos_token, enable_thinking (on
    unless `kwargs` turns it off, as llama-server's default), preserve_reasoning (on, as llama-server's default:
    the templates that can keep earlier turns' reasoning keep it, so a conversation's prompt only grows), the
    date strings, and `kwargs` (a request's chat_template_kwargs: reasoning_effort, ...). A template that refuses
    the messages (its raise_exception) or fails on them raises TemplateError with its own message."""
    compiled = compile_template(template)
    caps = template_caps(template)
    now = datetime.now()
    context: dict[str, Any] = {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
                               "enable_thinking": True, "preserve_reasoning": True, **kwargs}
    effort = context.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        context.setdefault("reasoning_strength", effort)
    preserve = context.get("preserve_reasoning")
    if isinstance(preserve, bool):  # the names templates read it by (caps.cpp caps_apply_preserve_reasoning)
        for name, value in (("preserve_thinking", preserve), ("clear_thinking", not preserve),
                            ("truncate_history_thinking", not preserve), ("drop_thinking", not preserve)):
            context.setdefault(name, value)
    if tools:
        context["tools"] = copy.deepcopy(list(tools))
        # firefunction-v2's template reads its tools as `functions`, the JSON llama.cpp's own handler for it passed
        context.setdefault("functions", json.dumps(list(tools), indent=2, ensure_ascii=False))
    context.update(messages=shape_messages(template, messages, caps), add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token)
    return _run(compiled, context)


# --- the Jinja environment --------------------------------------------------------------------------------


class _Refused(Exception):
    """The template's own raise_exception(message)."""


def _raise_exception(message: Any = "") -> None:
    raise _Refused(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _json_default(value: Any) -> Any:
    """What tojson writes for what is not JSON in Python: a filter's generator or a dict view as the list it is
    (llama.cpp's map/select give lists), an undefined value as null."""
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, (GeneratorType, map, filter, KeysView, ValuesView, ItemsView, tuple, range)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators=None,
            sort_keys: bool = False) -> str:
    """tojson as Transformers and llama.cpp write it: not ASCII-escaped, not HTML-escaped."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_json_default)


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """Transformers' `{% generation %}` marks the assistant's text for training masks: rendered as its body."""

    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Environment(SandboxedEnvironment):
    """A sandbox in which templates change their own lists and dicts (append, pop, update: llama.cpp's engine
    allows it, Kimi K2's templates queue tool-call ids in a list) while private attributes, Python internals
    and unsafe callables stay refused; `none + "text"` is the text, as llama.cpp computes it."""

    intercepted_binops = frozenset({"+"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            if isinstance(left, str) and (right is None or isinstance(right, jinja2.Undefined)):
                return left
            if isinstance(right, str) and (left is None or isinstance(left, jinja2.Undefined)):
                return right
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=1)
def _environment() -> _Environment:
    # undefined as llama.cpp's: a member of it is undefined too (Command R+'s template reads tools' old fields)
    environment = _Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                               undefined=jinja2.ChainableUndefined,
                               extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols, jinja2.ext.do])
    environment.filters["tojson"] = _tojson
    # `safe` marks nothing: without autoescaping, a Markup would escape the text added to it (functionary v3.1)
    environment.filters["safe"] = str
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return environment


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """The template compiled once (a few ms each time otherwise) in the environment every prompt renders in;
    one that is not valid Jinja raises TemplateError (compiling) naming its line."""
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(exc.message or str(exc), line=exc.lineno, compiling=True) from None


def _run(compiled: jinja2.Template, context: dict[str, Any]) -> str:
    try:
        return compiled.render(**context)
    except _Refused as exc:
        raise TemplateError(str(exc)) from None
    except Exception as exc:  # a template that fails on these messages: Jinja's words, at the template's line
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError)):
            reason = f"{type(exc).__name__}: {reason}"
        raise TemplateError(reason, line=_template_line(exc.__traceback__)) from None


def _template_line(tb) -> Optional[int]:
    """The template's line where rendering failed (Jinja maps its frames to template lines)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# --- what a template takes: found by rendering probes, as llama.cpp's common/jinja/caps.cpp ---------------


@dataclass(frozen=True)
class TemplateCaps:
    string_content: bool = True  # a message's content as a string (else typed parts: [{"type": "text", ...}])
    system_role: bool = True  # a system message at the start
    system_in_place: bool = True  # a system message later in the conversation, rendered where it is
    tools: bool = False  # the tools offered are written in the prompt
    tool_calls: bool = False  # an assistant's tool calls are written
    object_arguments: bool = False  # a tool call's arguments as an object (else as a JSON string)
    short_ids: bool = False  # tool-call ids of 9 letters and digits only (Mistral's templates)
    reasoning: bool = False  # an earlier answer's reasoning_content is written back


_MARK = "MARK_{}_KRAM"  # text no template writes itself (ASCII: some templates escape the rest in JSON)
_LONG_ID = "call_Zq8dR2xK7mWp4LtN0vYb3sHc"  # as OpenAI and its clients write ids
_SHORT_ID = "call00001"  # 9 alphanumerics, as caps.cpp's probes (Mistral's templates require them)


def _probe_tools() -> list[dict]:
    return [{"type": "function", "function": {"name": "probe_tool", "description": _MARK.format("tool_description"),
             "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                            "required": ["arg"]}}}]


def _probe_call(arguments: Any, call_id: str) -> list[dict]:
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "probe_tool", "arguments": arguments}}]},
            {"role": "tool", "content": "Tool response", "tool_call_id": call_id, "name": "probe_tool"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


def _probe(compiled: jinja2.Template, messages: list[dict], tools: Optional[list[dict]] = None, **extra: Any) -> Optional[str]:
    """The probe's rendering, or None where the template refuses or fails on it."""
    context = {"messages": copy.deepcopy(messages), "add_generation_prompt": True, "bos_token": "", "eos_token": "",
               "enable_thinking": True, "raise_exception": _raise_exception, **extra}
    if tools:
        context["tools"] = tools
    try:
        return compiled.render(**context)
    except Exception:
        return None


@lru_cache(maxsize=16)
def template_caps(template: str) -> TemplateCaps:
    """What `template` takes, found by rendering probes once (as llama.cpp's caps.cpp, by what each probe's
    marked text becomes in the output rather than by which values the template reads)."""
    compiled = compile_template(template)
    text = _MARK.format("text")
    out = _probe(compiled, [{"role": "user", "content": text}])
    string_content = out is not None and text in out
    if not string_content:
        out = _probe(compiled, [{"role": "user", "content": [{"type": "text", "text": text}]}])
        string_content = not (out is not None and text in out)  # typed parts only where they render
    system = _MARK.format("system")
    out = _probe(compiled, [{"role": "system", "content": system}, {"role": "user", "content": "User message"}])
    system_role = out is not None and system in out
    answer, later = _MARK.format("answer"), _MARK.format("later_system")
    out = _probe(compiled, [{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"},
                            {"role": "assistant", "content": answer}, {"role": "system", "content": later},
                            {"role": "user", "content": "User message"}])
    in_place = system_role and out is not None and later in out and answer in out and out.index(later) > out.index(answer)
    out = _probe(compiled, [{"role": "user", "content": "User message"}], _probe_tools())
    tools = out is not None and "probe_tool" in out and _MARK.format("tool_description") in out
    calls = _calls(compiled)
    reasoning = _MARK.format("reasoning")
    out = _probe(compiled, [{"role": "user", "content": "User message"},
                            {"role": "assistant", "content": "Assistant message", "reasoning_content": reasoning},
                            {"role": "user", "content": "User message"},
                            {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning"},
                            {"role": "user", "content": "User message"}], preserve_thinking=True, clear_thinking=False)
    return TemplateCaps(string_content=string_content, system_role=system_role, system_in_place=in_place, tools=tools,
                        reasoning=out is not None and reasoning in out, **calls)


def _calls(compiled: jinja2.Template) -> dict[str, bool]:
    """How the template takes tool calls: arguments as an object where it reads them as one (its output holds
    the argument's value, not a Python dict's text), else as a JSON string; ids of 9 alphanumerics where it
    refuses an OpenAI client's ids and takes those."""
    value = _MARK.format("argument")
    for object_arguments, arguments in ((True, {"arg": value}), (False, json.dumps({"arg": value}, ensure_ascii=False))):
        for short_ids, call_id in ((False, _LONG_ID), (True, _SHORT_ID)):
            out = _probe(compiled, _probe_call(arguments, call_id), _probe_tools())
            if out is None:
                continue
            if object_arguments and (value not in out or f"'arg': '{value}'" in out):
                break  # renders, but does not read the object: the string probe decides
            return {"tool_calls": value in out, "object_arguments": object_arguments, "short_ids": short_ids}
    return {}


# --- the messages as a template takes them (llama.cpp's common/chat.cpp workarounds) ----------------------


def shape_messages(template: str, messages: Sequence[dict], caps: Optional[TemplateCaps] = None) -> list[dict]:
    """Copies of `messages` as `template` takes them (the caller's are left as they are): content null → "";
    developer → system (not for gpt-oss, whose template has a developer role); a system message the template
    does not render where it stands put at the start of the next user message (a conversation that grows
    keeps its prompt as a prefix); tool-call arguments as an object or a JSON string and ids as the template
    demands; a message's reasoning_content passed on (under the name the family's template reads too); the
    adjustments llama.cpp makes for a few families (its common/chat.cpp and common/parsers/)."""
    caps = caps or template_caps(template)
    shaped = [_copied(m, caps) for m in messages]
    if "<|channel|>" not in template:
        for m in shaped:
            if m.get("role") == "developer":
                m["role"] = "system"
    if "You have access to the following functions in JSONSchema format" in template:  # StepFun: trimmed
        for m in shaped:
            for key in ("content", "reasoning_content"):
                if isinstance(m.get(key), str):
                    m[key] = m[key].strip()
    shaped = _placed_systems(shaped, caps, template)
    _shape_calls(shaped, caps)
    for detects, adjust in _FAMILY_ADJUSTMENTS:
        if detects(template):
            shaped = adjust(shaped)
    if not caps.string_content:
        for m in shaped:
            if isinstance(m.get("content"), str):
                m["content"] = [{"type": "text", "text": m["content"]}]
    return shaped


def _copied(message: dict, caps: TemplateCaps) -> dict:
    m = copy.deepcopy(dict(message))
    content = m.get("content")
    if content is None:
        m["content"] = ""
    elif isinstance(content, list) and caps.string_content:  # typed text parts, joined as llama.cpp joins them
        m["content"] = "\n".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
    if not m.get("reasoning_content"):
        m.pop("reasoning_content", None)
    return m


def _placed_systems(messages: list[dict], caps: TemplateCaps, template: str) -> list[dict]:
    """System messages where the template renders them. One it does not (no system role at all, as Gemma 2's; or
    none after the start, or moved to the top, as DeepSeek V3.1's) joins the user's text beside it: the end of
    the user message it follows, else the start of the next user message ("\\n" between, as llama.cpp merges a
    first system message), else it is a user message at the end. Either way what came before it renders as it
    did the turn before, and a client's reminder in the middle of a conversation does not change its start."""
    placed: list[dict] = []
    waiting: list[str] = []
    for i, m in enumerate(messages):
        if m.get("role") == "system" and not (caps.system_role if i == 0 else caps.system_in_place):
            if i > 0:
                _notice_once(template, "this chat template does not render a system message after the conversation's "
                                       "start where it stands: such a message joins the user's message beside it")
            if placed and placed[-1].get("role") == "user" and not waiting:
                placed[-1] = {**placed[-1], "content": _joined(placed[-1].get("content"), _text(m.get("content")))}
            else:
                waiting.append(_text(m.get("content")))
            continue
        if waiting and m.get("role") == "user":
            m = {**m, "content": _joined("\n".join(waiting), m.get("content"))}
            waiting = []
        placed.append(m)
    if waiting:
        placed.append({"role": "user", "content": "\n".join(waiting)})
    return placed


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
    return "" if content is None else str(content)


def _joined(first: Any, second: Any) -> Any:
    """Two contents as one, a line between (typed parts stay parts)."""
    if isinstance(first, list) or isinstance(second, list):
        def parts(content: Any) -> list:
            return content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        return [*parts(first), *parts(second)]
    return f"{first or ''}\n{second or ''}"


_noticed: set[int] = set()


def _notice_once(template: str, message: str) -> None:
    """Said once per template and process, on stderr (what rendering did to a client's messages)."""
    key = hash(template)
    if key not in _noticed:
        _noticed.add(key)
        print(f"notice: {message}", file=sys.stderr, flush=True)


def _shape_calls(messages: list[dict], caps: TemplateCaps) -> None:
    """Tool-call arguments as the template reads them; ids mapped to 9 alphanumerics where it demands them
    (the same id always to the same one, so a call and its result still match; a call without an id, and its
    result after it, get one from their place)."""
    waiting: list[str] = []  # the last calls' ids, for results that name none
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            waiting = []
            for k, call in enumerate(calls):
                function = call.get("function")
                if not isinstance(function, dict):
                    continue
                arguments = function.get("arguments")
                if caps.object_arguments and isinstance(arguments, str):
                    try:
                        function["arguments"] = json.loads(arguments) if arguments.strip() else {}
                    except ValueError:
                        raise TemplateError(f"the arguments of the tool call {function.get('name')!r} are not JSON: "
                                            f"{arguments[:80]!r}") from None
                elif not caps.object_arguments and arguments is not None and not isinstance(arguments, str):
                    function["arguments"] = json.dumps(arguments, ensure_ascii=False)
                if caps.short_ids:
                    call["id"] = _short_id(call.get("id") or f"{function.get('name')}:{i}:{k}")
                    waiting.append(call["id"])
        elif m.get("role") == "tool" and caps.short_ids:
            given = m.get("tool_call_id")
            m["tool_call_id"] = _short_id(given) if given else (waiting.pop(0) if waiting else _short_id(f"result:{i}"))
            if m["tool_call_id"] in waiting:
                waiting.remove(m["tool_call_id"])


_ALPHANUMERIC = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _short_id(call_id: str) -> str:
    """A tool-call id as 9 letters and digits: one already so is kept, any other is hashed (the same
    everywhere, every time)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    digits = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALPHANUMERIC))
        digits.append(_ALPHANUMERIC[digit])
    return "".join(digits)


# A family's own message shape, as llama.cpp's parsers build it before rendering (common/parsers/*.cpp): the
# template's text tells the family, as it does there.

def _thinking_field(drop_content_with_calls: bool):
    def adjust(messages: list[dict]) -> list[dict]:
        for m in messages:
            if isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m["reasoning_content"]
                if drop_content_with_calls and m.get("tool_calls"):
                    m.pop("content", None)
        return messages
    return adjust


def _thinking_blocks(messages: list[dict]) -> list[dict]:
    """Ministral 3: a system or assistant message's content as blocks, its reasoning first as a thinking block."""
    for m in messages:
        if m.get("role") not in ("system", "assistant"):
            continue
        blocks = []
        if isinstance(m.get("reasoning_content"), str):
            blocks.append({"type": "thinking", "thinking": m.pop("reasoning_content")})
        content = m.get("content")
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        elif isinstance(content, list):
            blocks.extend(content)
        m["content"] = blocks
    return messages


def _results_in_call_order(messages: list[dict]) -> list[dict]:
    """DeepSeek V4: the results of consecutive tool messages in the order of the calls they answer."""
    order: dict[str, int] = {}
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "assistant" and m.get("tool_calls"):
            order = {call.get("id"): k for k, call in enumerate(m["tool_calls"]) if call.get("id")}
            i += 1
            continue
        if m.get("role") not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(messages) and messages[end].get("role") in ("user", "tool"):
            end += 1
        places = [j for j in range(i, end) if messages[j].get("role") == "tool"]
        if len(places) > 1 and order:
            results = sorted((messages[j] for j in places), key=lambda r: order.get(r.get("tool_call_id"), 0))
            for j, result in zip(places, results):
                messages[j] = result
        i = end
    return messages


def _tool_responses(messages: list[dict]) -> list[dict]:
    """Gemma 4's older templates: an assistant's tool calls, their results (role tool) and the answer after them
    as one assistant message carrying `tool_responses`."""
    result, i = [], 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            result.append(m)
            i += 1
            continue
        turn = {"role": "assistant", "tool_calls": list(m["tool_calls"])}
        responses = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            tool = messages[i]
            try:
                response = json.loads(tool["content"]) if isinstance(tool.get("content"), str) else tool.get("content")
            except ValueError:
                response = tool["content"]
            k = len(responses)
            name = (turn["tool_calls"][k].get("function") or {}).get("name", "") if k < len(turn["tool_calls"]) else ""
            responses.append({"name": name or tool.get("tool_call_id", ""), "response": response})
            i += 1
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls") \
                and messages[i].get("content"):
            turn["content"] = messages[i]["content"]
            i += 1
        if responses:
            turn["tool_responses"] = responses
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        result.append(turn)
    return result


def _is_ministral_3(template: str) -> bool:
    return all(marker in template for marker in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) and "[CALL_ID]" not in template


def _is_lfm2(template: str) -> bool:
    return ("<|tool_list_start|>" in template and "<|tool_list_end|>" in template) or \
        ("List of tools: [" in template and "<|tool_list_start|>" not in template)


_FAMILY_ADJUSTMENTS: list[tuple[Callable[[str], bool], Callable[[list[dict]], list[dict]]]] = [
    (_is_ministral_3, _thinking_blocks),
    (lambda t: "<|channel|>" in t, _thinking_field(drop_content_with_calls=True)),  # gpt-oss reads `thinking`
    (_is_lfm2, _thinking_field(drop_content_with_calls=False)),
    (lambda t: "dsml_token" in t and "DSML" in t and "function_calls" not in t and "tool_calls" in t, _results_in_call_order),
    (lambda t: "'<|tool_call>call:'" in t and "{#- OpenAI Chat Completions:" not in t, _tool_responses),
]
