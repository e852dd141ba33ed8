"""Families whose calls are their own: gpt-oss's harmony channels, Functionary v3.2's recipients, LFM2's pythonic
call lists, Gemma 4's object syntax. Each reads whole or cut-short text as syntax.py's readers do."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from . import jsonish
from .syntax import FAIL, OPEN, WS, Cap, NameArgs, Opt, Section, Syntax, Tagged, find_first, held, match_any
from .types import ToolCall

_CHANNEL = r"[a-z]"
_NAME_END = (" ", "<|channel|>", "<|constrain|>", "<|message|>", "\n")


def Harmony() -> NameArgs:
    """gpt-oss: a call names its recipient in the role header or in the channel header, then its arguments:
      <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
      <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}
    (the first call of an answer without its <|start|>assistant, which the prompt wrote)."""
    tail = (WS, Opt("<|constrain|>"), Opt("json"), WS, "<|message|>")
    in_channel = (Opt("<|start|>assistant"), "<|channel|>", Cap("channel", (" ", "to="), _CHANNEL), WS, "to=functions.",
                  Cap("name", _NAME_END), *tail)
    in_role = (Opt("<|start|>assistant"), WS, "to=functions.", Cap("name", _NAME_END), WS, "<|channel|>",
               Cap("channel", ("<|message|>", " ", "<|constrain|>"), _CHANNEL), *tail)
    syntax = _HarmonyCalls(in_channel, headers=(in_role,), call_close="<|call|>")
    return syntax


@dataclass
class _HarmonyCalls(NameArgs):
    always = True  # builtin tools' messages are consumed whether or not the client offered functions

    @property
    def starts(self):
        return ("<|start|>assistant", "<|channel|>", " to=", "to=")

    def read(self, text, at, partial, tools):
        preamble = _PREAMBLE.match(text, at)
        if preamble:  # a message to the user on the commentary channel, before calls: content
            end = text.find("<|end|>", preamble.end())
            if end < 0:
                body = text[preamble.end():]
                return Section(len(text), [], True, body[:len(body) - held(body, ("<|end|>",))] if partial else body, other=True)
            return Section(end + len("<|end|>"), [], False, text[preamble.end():end], other=True)
        if partial and _PREAMBLE_START.fullmatch(text, at):
            return Section(len(text), [], True, other=True)
        section = super().read(text, at, partial, tools)
        if section is not None:
            return section
        # a message to a recipient that is no function of the client's (gpt-oss's builtin tools: to=python,
        # to=container.exec): nothing here runs it, and its text is not the answer: consumed, as llama.cpp does
        m = _BUILTIN.match(text, at)
        if m is None:
            if partial and _BUILTIN_START.fullmatch(text, at):
                return Section(len(text), [], True, other=True)
            return None
        end = text.find("<|end|>", m.end())
        if end < 0:
            return Section(len(text), [], True, other=True)
        return Section(end + len("<|end|>"), [], other=True)


_PREAMBLE = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>commentary<\|message\|>")
_PREAMBLE_START = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>(?:c(?:o(?:m(?:m(?:e(?:n(?:t(?:a(?:r(?:y(?:<(?:\|(?:m[a-z]*(?:\|>?)?)?)?)?)?)?)?)?)?)?)?)?)?)?")
_BUILTIN = re.compile(r"(?:<\|start\|>assistant)?\s*(?:to=(?!functions\.)[\w.-]+\s*<\|channel\|>[a-z]+|<\|channel\|>[a-z]+\s+to=(?!functions\.)[\w.-]+)"
                      r"[^<]*(?:<\|constrain\|>[\w-]+)?\s*<\|message\|>")
_BUILTIN_START = re.compile(r"(?:<\|start\|>assistant)?\s*(?:to=[\w.-]*|<\|channel\|>[a-z]*\s*(?:to=[\w.-]*)?)[^\n]*")


@dataclass
class FunctionaryV32(Syntax):
    """Functionary v3.2: after the prompt's ">>>", a recipient line then its message: "all" for text to the user,
    a function's name for its arguments (JSON); each further message after ">>>" again."""

    starts = (">>>",)
    always = True  # its answer is its messages to "all", whether or not tools were offered

    def read_all(self, text, partial, tools):
        segments = text.split(">>>")
        parts, calls, found, holding, found_all = [], [], False, False, False
        content = ""
        for n, segment in enumerate(segments):
            last = n == len(segments) - 1
            head, newline, body = segment.partition("\n")
            if not newline:
                if partial and last:
                    # the recipient line is not whole yet
                    if "all".startswith(head.strip()) or tools is None or any(x.startswith(head.strip()) for x in tools.names):
                        holding = True
                        break
                content += (">>>" if n else "") + segment
                continue
            recipient = head.strip()
            if recipient == "all":
                found_all = True
                content += body if not (partial and last) else body[:len(body) - held(body, (">>>",))]
                continue
            if tools is not None and tools.names and recipient not in tools.names:
                content += (">>>" if n else "") + segment
                continue
            found = True
            parts.append(content)
            content = ""
            raw = body.strip()
            value = jsonish.loads(raw) if raw else None
            if isinstance(value, dict):
                calls.append(ToolCall(recipient, raw))
            elif raw and not raw.startswith("{"):  # python's code written as it is
                calls.append(ToolCall(recipient, jsonish.dumps({"code": body})))
            elif partial and last:
                calls.append(ToolCall(recipient, raw))
            else:
                calls.append(ToolCall(recipient, "{}" if not raw else raw))
        parts.append(content)
        return (parts, calls) if found or holding or found_all else None


@dataclass
class Pythonic(Syntax):
    """LFM2: <|tool_call_start|>[name(key="value", n=1), other()]<|tool_call_end|>: Python calls with literal
    arguments."""

    open: str
    close: str

    @property
    def starts(self):
        return (self.open,)

    def read(self, text, at, partial, tools):
        i = jsonish.skip_blank(text, at + len(self.open))
        if i >= len(text):
            return Section(len(text), [], True) if partial else None
        bracketed = text[i] == "["
        if bracketed:
            i += 1
        calls: list[ToolCall] = []
        while True:
            i = jsonish.skip_blank(text, i)
            if i >= len(text):
                return Section(len(text), calls, True) if partial else (Section(i, calls) if calls else None)
            if bracketed and text[i] == "]":
                i = jsonish.skip_blank(text, i + 1)
                break
            if text[i] == ",":
                i += 1
                continue
            m = re.compile(r"([A-Za-z_][\w.-]*)\s*\(").match(text, i)
            if m is None:
                if partial and re.fullmatch(r"[A-Za-z_][\w.-]*\s*", text[i:]):
                    return Section(len(text), calls, True)
                return None if not calls else Section(i, calls)
            name = m.group(1)
            if tools is not None and tools.names and name not in tools.names:
                return None if not calls else Section(i, calls)
            end = _paren_end(text, m.end() - 1)
            if end is None:
                return Section(len(text), calls + [ToolCall(name, "")], True) if partial else (Section(i, calls) if calls else None)
            args = _python_kwargs(text[m.end():end - 1])
            if args is None:
                return None if not calls else Section(i, calls)
            calls.append(ToolCall(name, jsonish.dumps(args)))
            i = end
            if not bracketed:
                break
        if text.startswith(self.close, i):
            i += len(self.close)
        elif partial and self.close.startswith(text[i:]):
            return Section(len(text), calls, True)
        return Section(i, calls)


def _paren_end(text: str, start: int) -> Optional[int]:
    """The end (exclusive) of the parenthesised Python arguments opening at text[start]."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _python_kwargs(inner: str) -> Optional[dict]:
    try:
        node = ast.parse(f"f({_pythonic(inner)})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    out = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None
        try:
            value = ast.literal_eval(kw.value)
        except ValueError:
            return None
        out[kw.arg] = list(value) if isinstance(value, tuple) else value
    return out


def _pythonic(text: str) -> str:
    """JSON's literals (true, false, null) outside strings written as Python's: models mix the two."""
    out, i = [], 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\b(true|false|null)\b', text):
        out.append(text[i:m.start()])
        out.append({"true": "True", "false": "False", "null": "None"}.get(m.group(1), m.group(0)) if m.group(1) else m.group(0))
        i = m.end()
    out.append(text[i:])
    return "".join(out)


_GEMMA_QUOTE = '<|"|>'


@dataclass
class Gemma4(Syntax):
    """Gemma 4: <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,list:[...]}<tool_call|>: unquoted keys, strings
    between <|"|>."""

    starts = ("<|tool_call>",)

    def read(self, text, at, partial, tools):
        i = at + len("<|tool_call>")
        state, j, caps = match_any((("call:", Cap("name", ("{",), r"[\w.-]")),), text, i)
        if state == FAIL:
            return None
        if state == OPEN:
            return Section(len(text), [], True) if partial else None
        name = caps["name"]
        if tools is not None and tools.names and name not in tools.names:
            return None
        end = _gemma_end(text, j)
        if end is None:
            return Section(len(text), [ToolCall(name, "")], True) if partial else None
        args = _gemma_value(text[j:end])
        if not isinstance(args, dict):
            return None
        i = end
        if text.startswith("<tool_call|>", i):
            i += len("<tool_call|>")
        elif partial and "<tool_call|>".startswith(text[i:]):
            return Section(len(text), [ToolCall(name, jsonish.dumps(args))], True)
        return Section(i, [ToolCall(name, jsonish.dumps(args))])


def _gemma_end(text: str, start: int) -> Optional[int]:
    depth, i = 0, start
    while i < len(text):
        if text.startswith(_GEMMA_QUOTE, i):
            close = text.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            if close < 0:
                return None
            i = close + len(_GEMMA_QUOTE)
            continue
        c = text[i]
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _gemma_value(text: str):
    """Gemma 4's object syntax as JSON's values."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(_GEMMA_QUOTE, i):
            close = text.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            out.append(jsonish.dumps(text[i + len(_GEMMA_QUOTE):close]))
            i = close + len(_GEMMA_QUOTE)
            continue
        m = re.compile(r"([{,]\s*)([^:{}\[\],\"<\s][^:{}\[\],]*?)\s*:").match(text, i)
        if m:
            out.append(m.group(1) + jsonish.dumps(m.group(2).strip()) + ":")
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return jsonish.loads("".join(out))


@dataclass
class Recipients(Syntax):
    """Muse Glimmer: messages " to=RECIPIENT<|message|>TEXT<|eom|>", each after "<|start|>assistant": to=user is the
    answer, to=self the thinking, to=a function its call (<atem:function_calls> markup)."""

    starts = (" to=", "to=")
    always = True  # its answer is read even without tools (the recipients are its format, not only its calls)

    def read_all(self, text, partial, tools):
        from .types import Message

        message = Message()
        calls_reader = _ATEM
        pieces = re.split(r"<\|start\|>assistant", text)
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            m = re.match(r"\s*to=([\w.-]+)\s*<\|message\|>", piece)
            if m is None:
                if partial and last and re.fullmatch(r"\s*(t(o(=[\w.-]*(\s*<(\|(m[a-z]*(\|>?)?)?)?)?)?)?)?", piece):
                    break  # the header is still coming
                message.content += piece
                continue
            recipient, body = m.group(1), piece[m.end():]
            end = re.search(r"<\|eo[mt]\|>", body)
            body = body[:end.start()] if end else (body[:len(body) - held(body, ("<|eom|>", "<|eot|>"))] if partial else body)
            if recipient == "user":
                message.content += body
            elif recipient == "self":
                message.reasoning += body
            elif tools is not None:
                found = calls_reader.read_all(body, partial, tools)
                if found is not None:
                    message.calls += found[1]
        return message


_ATEM = Tagged(('<atem:invoke name="', Cap("name", ('"',)), '">'), ('<atem:parameter name="', Cap("key", ('"',)), '">'),
               "</atem:parameter>", "</atem:invoke>", section_open="<atem:function_calls>", section_close="</atem:function_calls>")
