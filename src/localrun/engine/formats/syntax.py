"""How families write tool calls, as readers parameterised by their markers, and the reading of an answer into
content and calls (whole, or cut short while it streams).

Three shapes cover most families (each a small reader over a sequence of literals and captures):
  JsonCalls   a marker, then a call object {"name": ..., "arguments": {...}} or a list of them (Hermes, Granite,
              Nemotron, Mistral Nemo, Apriel, Command R7B's tool_name/parameters, Apertus's {"NAME": {...}})
  NameArgs    a marker, the name, a marker, the arguments' JSON object (DeepSeek V3.1 and R1, Kimi K2, Mistral's
              [TOOL_CALLS]NAME[ARGS], Functionary v3.1's <function=NAME>, gpt-oss's to=functions.NAME)
  Tagged      the name in a tag, then each argument in tags of its own, values as written (Qwen3-Coder, Seed-OSS,
              GLM 4.x, MiniMax M2, DeepSeek V3.2's DSML, MiniCPM5); a value's type comes from the tool's schema
and a few that are their own (pythonic calls of LFM2, Gemma 4's object syntax).

While an answer streams, a call is given out as soon as its name is known and its arguments grow as they are
written (JSON text as the model writes it; a tagged call's arguments as the JSON object being built), so a
client sees progress rather than silence; text that cannot start a call is content at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import jsonish
from .types import Message, ToolCall

# -- the tools offered ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    names: frozenset
    schemas: dict = field(default_factory=dict, hash=False, compare=False)  # name -> its parameters schema

    @classmethod
    def of(cls, tools: list[dict[str, Any]]) -> "Tools":
        schemas = {}
        for t in tools:
            f = t.get("function", t)
            if isinstance(f, dict) and isinstance(f.get("name"), str):
                schemas[f["name"]] = f.get("parameters") or {}
        return cls(frozenset(schemas), schemas)

    def only(self, names) -> "Tools":
        """The same tools' schemas, calls read only to these (OpenAI's allowed_tools)."""
        return Tools(frozenset(names) & self.names, self.schemas)

    def kinds(self, name: str, key: str) -> set[str]:
        """The JSON types a parameter may take, from its schema ({"string"} when it says nothing)."""
        prop = (self.schemas.get(name) or {}).get("properties", {}).get(key)
        if not isinstance(prop, dict):
            return set()
        return _types(prop)

    def value(self, name: str, key: str, text: str) -> Any:
        """A parameter's value written as text, typed by its schema: a string stays the text; other types are
        read as JSON (or a Python literal), falling back to the text."""
        kinds = self.kinds(name, key)
        if kinds == {"string"}:
            return text
        value = jsonish.scalar(text)
        if "string" in kinds and not isinstance(value, (dict, list)) and not _fits(value, kinds):
            return text
        return value


def _types(schema: dict) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    out: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            if isinstance(sub, dict):
                out |= _types(sub)
    if "enum" in schema and not out:
        out = {"string" if isinstance(v, str) else "number" for v in schema["enum"]}
    return out


def _fits(value: Any, kinds: set[str]) -> bool:
    return any({"string": isinstance(value, str), "null": value is None, "boolean": isinstance(value, bool),
                "integer": isinstance(value, int) and not isinstance(value, bool),
                "number": isinstance(value, (int, float)) and not isinstance(value, bool),
                "object": isinstance(value, dict), "array": isinstance(value, list)}.get(k, False) for k in kinds)


# -- a sequence of literals and captures, matched on text that may stop anywhere --------------------------------

OPEN, FAIL = "open", "fail"


@dataclass(frozen=True)
class Cap:
    """Capture text up to (not including) the first of `until`; `chars`: what it may hold."""

    name: str
    until: tuple[str, ...]
    chars: str = r"[^\s<>\[\]{}\"']"


@dataclass(frozen=True)
class Opt:
    text: str


WS = "\x00ws"  # any blanks


Item = Union[str, Cap, Opt]


def match(seq: tuple, text: str, i: int) -> tuple[str, int, dict]:
    """Match `seq` at text[i]: ("ok", end, captures), (OPEN, ...) when the text stops inside it, (FAIL, ...)."""
    caps: dict[str, str] = {}
    for item in seq:
        if item == WS:
            i = jsonish.skip_blank(text, i)
        elif isinstance(item, str):
            if text.startswith(item, i):
                i += len(item)
            elif item.startswith(text[i:]):
                return OPEN, i, caps
            else:
                return FAIL, i, caps
        elif isinstance(item, Opt):
            if text.startswith(item.text, i):
                i += len(item.text)
            elif item.text.startswith(text[i:]) and i < len(text):
                return OPEN, i, caps
        else:  # Cap
            ends = [(text.find(u, i), u) for u in item.until]
            found = [(e, u) for e, u in ends if e >= 0]
            stop = min(found)[0] if found else len(text)
            value = text[i:stop]
            if not found:  # the end may be arriving: what is written so far must fit
                value = value[:len(value) - held(value, item.until)]
            kept = value.rstrip() if not re.fullmatch(item.chars, " ") else value  # blanks before the end: not its
            if not re.fullmatch(f"(?:{item.chars})*", kept):
                return FAIL, i, caps
            if not found:
                return OPEN, i, caps
            if not kept:
                return FAIL, i, caps
            caps[item.name] = kept
            i = stop if kept == value else i + len(kept)
    return "ok", i, caps


def match_any(seqs: tuple, text: str, i: int) -> tuple[str, int, dict]:
    """The first of several sequences that matches at text[i]; else OPEN if one may still, else FAIL."""
    outcome = (FAIL, i, {})
    for seq in seqs:
        state, end, caps = match(seq, text, i)
        if state == "ok":
            return state, end, caps
        if state == OPEN:
            outcome = (state, end, caps)
    return outcome


def held(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that may be the start of one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if m.startswith(text[-n:]):
                best = n
                break
    return best


def find_first(text: str, markers: tuple[str, ...], pos: int) -> tuple[int, str]:
    found = [(text.find(m, pos), m) for m in markers]
    found = [(i, m) for i, m in found if i >= 0]
    return min(found, key=lambda x: (x[0], -len(x[1]))) if found else (-1, "")


# -- readers ------------------------------------------------------------------------------------------------------


@dataclass
class Section:
    end: int
    calls: list[ToolCall]
    open: bool = False  # the text stopped inside it
    text: str = ""  # what of it is content (gpt-oss's preamble to the user, in its own message)
    other: bool = False  # no call but a message of the family's own (a preamble, a builtin tool's): never "cut short"


class Syntax:
    starts: tuple[str, ...] = ()

    def read(self, text: str, at: int, partial: bool, tools) -> Optional[Section]:
        raise NotImplementedError

    def read_all(self, text: str, partial: bool, tools) -> Optional[tuple[list[str], list[ToolCall]]]:
        """(the content's parts, the calls) of the whole answer; None when it holds no call of this syntax."""
        return _read_sections(self, text, partial, tools)


def _json_call(text: str, at: int, partial: bool, name_keys, args_keys, id_keys=(), name_as_key=False,
               tools=None) -> tuple[str, int, Optional[ToolCall]]:
    """The call written as a JSON object at text[at]: ("ok", end, call), (OPEN, at, call so far or None),
    (FAIL, at, None)."""
    end = jsonish.value_end(text, at)
    name, args, ident, args_open = None, None, "", False
    for key, vs, ve in jsonish.members(text, at):
        if name_as_key:
            name = key
            if ve is None:
                args, args_open = text[vs:].rstrip(), True
            else:
                args = text[vs:ve]
            break
        if key in name_keys and ve is not None:
            value = jsonish.loads(text[vs:ve])
            if isinstance(value, str):
                name = value
        elif key in args_keys:
            if ve is None:
                args, args_open = (text[vs:].rstrip() if text[vs] == "{" else ""), True
            else:
                raw = text[vs:ve]
                value = jsonish.loads(raw)
                if isinstance(value, str):  # the arguments written as a JSON string
                    inner = jsonish.loads(value) if value.strip() else {}
                    args = jsonish.dumps(inner) if isinstance(inner, dict) else None
                elif isinstance(value, dict):
                    args = raw
                else:
                    args = None
                    if end is not None:
                        return FAIL, at, None
        elif key in id_keys and ve is not None:
            value = jsonish.loads(text[vs:ve])
            ident = str(value) if value is not None else ""
    if end is None:  # cut short: the caller decides (a list keeps the calls before it)
        call = ToolCall(name, args or "", ident) if name else None
        return OPEN, at, call
    if not name:
        return FAIL, at, None
    if args is None:
        args = "{}"
    if tools is not None and tools.names and name not in tools.names:
        return FAIL, at, None
    return "ok", end, ToolCall(name, args, ident)


@dataclass
class JsonCalls(Syntax):
    """open + (a call object | a list of them), repeated, + close. `open` may be "" (a bare object/list at
    the start of the answer: Llama 3's JSON)."""

    open: str
    close: str = ""
    name_keys: tuple = ("name",)
    args_keys: tuple = ("arguments", "parameters")
    id_keys: tuple = ("id",)
    name_as_key: bool = False
    list_only: bool = False

    @property
    def starts(self):
        return (self.open,)

    def read(self, text, at, partial, tools):
        i = jsonish.skip_blank(text, at + len(self.open))
        if partial and re.fullmatch(r"(`{1,3}(j(s(on?)?)?)?)?", text[i:]):
            return Section(len(text), [], True)
        fence = re.compile(r"```(?:json)?\s*").match(text, i)
        if fence:
            i = fence.end()
        if i >= len(text):
            return Section(len(text), [], True)
        calls: list[ToolCall] = []
        if text[i] == "[":
            j = jsonish.skip_blank(text, i + 1)
            while True:
                if j >= len(text):
                    return Section(len(text), calls, True)
                if text[j] == "]":
                    i = j + 1
                    break
                if text[j] != "{":
                    return None
                state, end, call = _json_call(text, j, partial, self.name_keys, self.args_keys, self.id_keys, self.name_as_key, tools)
                if state == FAIL:
                    return None
                if state == OPEN:  # cut short: (while streaming) the call so far
                    return Section(len(text), calls + ([call] if call and partial else []), True)
                calls.append(call)
                j = jsonish.skip_blank(text, end)
                if j < len(text) and text[j] == ",":
                    j = jsonish.skip_blank(text, j + 1)
        elif text[i] == "{" and not self.list_only:
            state, end, call = _json_call(text, i, partial, self.name_keys, self.args_keys, self.id_keys, self.name_as_key, tools)
            if state == FAIL:
                return None
            if state == OPEN:
                return Section(len(text), [call] if call and partial else [], True)
            calls.append(call)
            i = end
        else:
            return None
        i = jsonish.skip_blank(text, i)
        surplus = re.compile(r"[}\]]+\s*").match(text, i)  # a brace too many after the call (small models slip so)
        if surplus and (not self.close or text.startswith(self.close, surplus.end()) or surplus.end() == len(text)
                        or text.startswith("`", surplus.end())):
            i = surplus.end()
        if fence:
            close = re.compile(r"`{1,3}").match(text, i)
            if close and partial and len(close.group(0)) < 3 and close.end() == len(text):
                return Section(len(text), calls, True)
            if close and len(close.group(0)) == 3:
                i = jsonish.skip_blank(text, close.end())
        if self.close:
            if text.startswith(self.close, i):
                i += len(self.close)
            elif partial and self.close.startswith(text[i:]):
                return Section(len(text), calls, True)
        return Section(i, calls)


def _starts(header: tuple, section_open: str, optional: bool) -> tuple[str, ...]:
    """Where a section of calls may begin: its marker, and where calls may come without it, a call's own."""
    first = header[0]
    bare = (first,) if isinstance(first, str) else ()
    return (section_open, *(bare if optional else ())) if section_open else bare


def _args_object(text: str, i: int, partial: bool) -> tuple[str, int, str]:
    """The arguments' JSON object at text[i] (after blanks): ("ok", end, raw), (OPEN, len, raw so far),
    (FAIL, i, "")."""
    i = jsonish.skip_blank(text, i)
    if i >= len(text):
        return OPEN, len(text), ""
    if text[i] != "{":
        return FAIL, i, ""
    end = jsonish.value_end(text, i)
    if end is None:
        return OPEN, len(text), text[i:].rstrip()
    raw = text[i:end]
    value = jsonish.loads(raw)
    if not isinstance(value, dict):
        return FAIL, i, ""
    return "ok", end, raw


@dataclass
class NameArgs(Syntax):
    """[section open] (call header holding the NAME, the arguments' JSON object, [call close])+ [section close].
    `header`: the sequence (match()) from a call's start to its arguments, capturing "name" (and "id")."""

    header: tuple
    call_close: str = ""
    section_open: str = ""
    section_close: str = ""
    sep: str = ""  # between calls (a blank is always allowed)
    fenced: bool = False  # the arguments in a ```json fence (DeepSeek R1)
    name_from_id: str = ""  # the name read out of the captured id (Kimi's functions.NAME:0), a regex's group 1
    headers: tuple = ()  # other sequences a call may begin with (gpt-oss writes its recipient in two places)
    section_optional: bool = False  # calls may come without their section's marker (Kimi K2 Thinking)

    @property
    def starts(self):
        return _starts(self.header, self.section_open, self.section_optional)

    def read(self, text, at, partial, tools):
        i = at
        if self.section_open and text.startswith(self.section_open, at):
            i += len(self.section_open)
        calls: list[ToolCall] = []
        while True:
            i = jsonish.skip_blank(text, i)
            if self.section_close and text.startswith(self.section_close, i):
                return Section(i + len(self.section_close), calls)
            if i >= len(text) or (partial and self.section_close.startswith(text[i:]) and self.section_close):
                if calls and not partial:
                    return Section(len(text), calls)
                return Section(len(text), calls, True)
            state, j, caps = match_any((self.header, *self.headers), text, i)
            if state == FAIL:
                if calls:
                    return Section(i, calls)  # what follows the calls is not one: content
                return None
            if state == OPEN:
                return Section(len(text), calls, True)
            if "name" in caps:
                name = caps["name"].strip()
            else:
                m = re.fullmatch(self.name_from_id, caps.get("id", "").strip())
                if m is None:
                    return Section(i, calls) if calls else None
                name = m.group(1)
            if tools is not None and tools.names and name not in tools.names:
                return Section(i, calls) if calls else None
            ident = caps.get("id", "")
            if self.fenced:
                if partial and re.fullmatch(r"\s*(`{1,3}(j(s(on?)?)?)?)?", text[j:]):
                    return Section(len(text), calls + [ToolCall(name, "", ident)], True)
                fence = re.compile(r"\s*```(?:json)?\s*").match(text, j)
                if fence:
                    j = fence.end()
            astate, end, raw = _args_object(text, j, partial)
            if astate == FAIL:
                return Section(i, calls) if calls else None
            if astate == OPEN:
                return Section(len(text), calls + ([ToolCall(name, raw, ident)] if partial else []), True)
            calls.append(ToolCall(name, raw, ident))
            i = end
            if self.fenced:
                close = re.compile(r"\s*(`{1,3})").match(text, i)
                if close and (len(close.group(1)) == 3 or not partial or close.end() < len(text)):
                    i = close.end()
                elif close:
                    return Section(len(text), calls, True)
            if self.call_close:
                k = jsonish.skip_blank(text, i)
                if text.startswith(self.call_close, k):
                    i = k + len(self.call_close)
                elif partial and k < len(text) and self.call_close.startswith(text[k:]) or partial and k == len(text):
                    return Section(len(text), calls, True)
            if self.sep:
                k = jsonish.skip_blank(text, i)
                if text.startswith(self.sep, k):
                    i = k + len(self.sep)
            if not self.section_open:
                # calls without a section around them: each begins with the header's own marker
                k = jsonish.skip_blank(text, i)
                if k >= len(text):
                    return Section(len(text), calls, partial)
                if match_any((self.header, *self.headers), text, k)[0] == FAIL:
                    return Section(i, calls)


@dataclass
class Tagged(Syntax):
    """[section open] (call header holding the NAME, then (argument header holding the KEY, its value as
    text, argument close)*, call close)+ [section close]. A value is typed by the tool's schema, or by the
    argument header's own `string="true|false"` (captured as "string")."""

    header: tuple
    arg: tuple
    arg_close: str
    call_close: str
    section_open: str = ""
    section_close: str = ""
    trim_newline: bool = False  # a value is written between newlines, one on each side not its own (Qwen3-Coder)
    section_optional: bool = False  # a call may come without its section's marker
    cdata: bool = False  # a value may be wrapped in <![CDATA[...]]> (MiniCPM5), which may hold the close marker
    nested: str = ""  # a value may be tags of its own after this marker: an object, or a list of <item>s (MiniMax M3)

    @property
    def starts(self):
        return _starts(self.header, self.section_open, self.section_optional)

    def read(self, text, at, partial, tools):
        i = at + (len(self.section_open) if self.section_open and text.startswith(self.section_open, at) else 0)
        calls: list[ToolCall] = []
        while True:
            i = jsonish.skip_blank(text, i)
            if self.section_close and text.startswith(self.section_close, i):
                return Section(i + len(self.section_close), calls)
            if i >= len(text):
                return Section(len(text), calls, partial or not calls)
            if partial and self.section_close and self.section_close.startswith(text[i:]):
                return Section(len(text), calls, True)
            state, j, caps = match(self.header, text, i)
            if state == FAIL:
                return Section(i, calls) if calls else None
            if state == OPEN:
                return Section(len(text), calls, True)
            name = caps["name"].strip().strip('"')
            if tools is not None and tools.names and name not in tools.names:
                return Section(i, calls) if calls else None
            state, end, call = self._call(text, j, name, partial, tools)
            if state == FAIL:
                return Section(i, calls) if calls else None
            if state == OPEN:
                return Section(len(text), calls + ([call] if partial else []), True)
            calls.append(call)
            i = end
            if not self.section_open:
                k = jsonish.skip_blank(text, i)
                if k >= len(text):
                    return Section(len(text), calls, partial)
                if match(self.header, text, k)[0] == FAIL:
                    return Section(i, calls)

    def _call(self, text, i, name, partial, tools):
        entries: list[str] = []
        while True:
            k = jsonish.skip_blank(text, i)
            if text.startswith(self.call_close, k):
                return "ok", k + len(self.call_close), ToolCall(name, "{" + ", ".join(entries) + "}")
            if k >= len(text) or self.call_close.startswith(text[k:]):
                if partial:
                    return OPEN, len(text), ToolCall(name, "{" + ", ".join(entries))
                if k >= len(text):  # the call's close never came: the arguments written whole still count
                    return "ok", len(text), ToolCall(name, "{" + ", ".join(entries) + "}")
            state, j, caps = match(self.arg, text, k)
            if state == FAIL:
                return FAIL, k, None
            if state == OPEN:
                return OPEN, len(text), ToolCall(name, "{" + ", ".join(entries))
            key = caps["key"].strip().strip('"')
            close = self.arg_close.replace("{key}", key)
            if "type" in caps:  # Kimi K3 says each value's type
                caps["string"] = "true" if caps["type"] == "string" else "false"
            if self.cdata and text.startswith("<![CDATA[", j):
                end_cdata = text.find("]]>", j)
                if end_cdata < 0:
                    if not partial:
                        return FAIL, k, None
                    return OPEN, len(text), ToolCall(name, "{" + ", ".join(entries))
                stop = text.find(close, end_cdata)
                if stop < 0:
                    return (OPEN, len(text), ToolCall(name, "{" + ", ".join(entries))) if partial else (FAIL, k, None)
                value = text[j + len("<![CDATA["):end_cdata]
                entries.append(jsonish.dumps(key) + ": " + jsonish.dumps(value))
                i = stop + len(close)
                continue
            stop = text.find(close, j)
            written = text[j:] if stop < 0 else text[j:stop]
            if self.trim_newline:
                written = written[1:] if written.startswith("\n") else written
            if stop < 0:
                written = written[:len(written) - held(written, (close,))]
                if self.trim_newline and written.endswith("\n"):
                    written = written[:-1]
                string = caps.get("string")
                if self.cdata and written.startswith("<![CDATA["[:len(written)]):
                    string = None  # a CDATA section comes whole
                elif string == "true" or string is None and tools is not None and tools.kinds(name, key) == {"string"}:
                    entries.append(jsonish.dumps(key) + ': "' + jsonish.string_body(written))  # the string so far
                return OPEN, len(text), ToolCall(name, "{" + ", ".join(entries))
            if self.trim_newline and written.endswith("\n"):
                written = written[:-1]
            if (self.nested and written.lstrip().startswith(self.nested + "<")
                    and not (tools is not None and "string" in tools.kinds(name, key))):
                value: Any = _nested(written, self.nested)
            elif caps.get("string") == "true":
                value = written
            elif caps.get("string") == "false":
                value = jsonish.scalar(written)
            elif tools is not None:
                value = tools.value(name, key, written)
            else:
                value = jsonish.scalar(written)
            entries.append(jsonish.dumps(key) + ": " + jsonish.dumps(value))
            i = stop + len(close)


def _nested(text: str, ns: str) -> Any:
    """MiniMax M3's structured value: ns<name>VALUE ns</name> pairs, an object (a list when every name is item)."""
    pairs, i = [], 0
    while True:
        m = re.compile(r"\s*" + re.escape(ns) + r"<([\w.-]+)>").match(text, i)
        if m is None:
            break
        name, depth, j = m.group(1), 1, m.end()
        open_, close = f"{ns}<{name}>", f"{ns}</{name}>"
        while depth:
            a, b = text.find(open_, j), text.find(close, j)
            if b < 0:
                return jsonish.scalar(text)
            if 0 <= a < b:
                depth, j = depth + 1, a + len(open_)
            else:
                depth, j = depth - 1, b + len(close)
        inner = text[m.end():j - len(close)]
        pairs.append((name, _nested(inner, ns) if inner.lstrip().startswith(ns + "<") else jsonish.scalar(inner)))
        i = j
    if pairs and all(name == "item" for name, _ in pairs):
        return [v for _, v in pairs]
    return dict(pairs)


# -- an answer read into content and calls --------------------------------------------------------------------------


def read_answer(family, answer: str, partial: bool, tools, reasoning: str = "auto") -> Message:
    """The answer (the thinking apart) as content and calls: the family's own calls where it writes them; else
    what lenient.py reads in any family's answer (fences, bare objects, other families' markers). Text with no
    call in it stays as written; around calls, each piece of text is trimmed. While the answer streams
    (`partial`), blanks at its end are held (they may come before a call)."""
    answer = family.unwrap(answer, partial, reasoning)
    syntax = family.calls
    if tools is None:
        # a family whose answer is made of messages to recipients (Functionary, gpt-oss's builtin tools): their
        # content is the answer, and calls none were offered for are not read
        if syntax is not None and getattr(syntax, "always", False):
            found = syntax.read_all(answer, partial, None)
            if isinstance(found, Message):
                return Message(content=found.content, reasoning=found.reasoning)
            if found is not None:
                return Message(content=_joined(found[0]) if found[1] else "".join(found[0]).rstrip())
        return Message(content=answer)
    if syntax is not None:
        found = syntax.read_all(answer, partial, tools)
        if isinstance(found, Message):
            return found
        if found is not None:
            parts, calls = found
            return Message(content=_joined(parts) if calls else "".join(parts).rstrip(), calls=calls)
    from . import lenient

    names = tools.names
    if partial:
        safe = lenient.safe_end(answer, names)
        if syntax is not None:
            safe = min(safe, len(answer) - held(answer, syntax.starts))
        return Message(content=answer[:safe].rstrip())
    content, found_calls = lenient.parse_tool_calls(answer, names)
    return Message(content=content, calls=[ToolCall(c["name"], jsonish.dumps(c["arguments"])) for c in found_calls])


def _read_sections(syntax: Syntax, text: str, partial: bool, tools) -> Optional[tuple[list[str], list[ToolCall]]]:
    """(the content's parts, the calls) of the family's call sections in `text`; None when it has none. A
    marker that does not begin a call (or begins a broken one) stays in the content."""
    parts: list[str] = []
    calls: list[ToolCall] = []
    content, pos, found, cut = "", 0, False, False
    while True:
        at, marker = find_first(text, syntax.starts, pos)
        if at < 0:
            rest = text[pos:]
            if partial:
                rest = rest[:len(rest) - held(rest, syntax.starts)]
            content += rest
            break
        content += text[pos:at]
        section = syntax.read(text, at, partial, tools)
        if section is None:
            content += marker
            pos = at + max(1, len(marker))
            continue
        found = True
        if section.other:  # content in the family's own markup, or a message that is not the client's
            content += section.text
            pos = max(section.end, at + 1)
            if section.open:
                break
            continue
        parts.append(content)
        content = ""
        calls += section.calls
        if section.open:  # the text stops inside it (while streaming, or cut short by max_tokens: then dropped)
            cut = True
            break
        pos = max(section.end, at + 1)
    parts.append(content)
    if not found or not partial and not calls and cut:
        return None  # nothing read, or only a call cut short: the whole answer is the lenient reader's (it stays text)
    return parts, calls


def _joined(parts: list[str]) -> str:
    from .lenient import joined

    return joined(parts)
