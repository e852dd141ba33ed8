"""What localrun reads as a tool call in any family's answer, beyond the family's own format: real models do
not always write theirs. Qwen2.5-Coder writes a call as a fenced block (```json\n{"name": ..., "arguments":
...}\n```), as a bare object, several in a row, with text around them, and sometimes with the doubled braces
its template prints ({{"name": ...}}). Every one of those forms is read as a call when it names one of the
tools offered (so JSON that merely looks like a call, about something else, stays text); the markers of the
families localrun read first (<tool_call>, [TOOL_CALLS], <|python_tag|>) are read as a call whatever they name.
Pure functions."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any, Optional

from .jsonish import value_end

Call = dict[str, Any]  # {"name": str, "arguments": dict}

_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_FENCE = "```"
_FENCE_LANGS = ("", "json", "json5", "jsonc", "tool_call", "tool_code", "tool", "javascript", "js")
_CALL_KEYS = ("name", "arguments", "parameters", "type", "function")  # what a call object may begin with
_ARGS_KEYS = ("arguments", "parameters")
_OBJECT_KEYS = {*_CALL_KEYS, "id", "call_id"}  # all a call object written without a marker may hold


# -- one JSON value at a position ----------------------------------------------------------------------


def _balanced_end(text: str, start: int) -> Optional[int]:
    """The end (exclusive) of the bracketed JSON-ish value opening at text[start] ('{' or '['), strings
    respected; None while it is still open."""
    return value_end(text, start)


def _loads(text: str) -> Any:
    """JSON, or the same with the doubled braces of a template's example undone (the outer pair, or every
    pair); None if none parses."""
    text = text.strip()
    candidates = [text]
    if text.startswith("{{") and text.endswith("}}"):
        candidates += [text[1:-1], text.replace("{{", "{").replace("}}", "}")]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    try:  # one closing brace too many after a whole value (small models slip so: {"name": ..., {...}}}})
        value, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        end = None
    if end is not None and _SURPLUS.fullmatch(text, end):
        return value
    if text.startswith("{{"):  # doubled braces, but not evenly: read each call by its shape
        return _by_shape(text) or None
    return None


_SURPLUS = re.compile(r"\s*[}\]]+")  # closing brackets a model wrote past the end of a whole call


_NAMED = re.compile(r'"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _by_shape(text: str) -> list[dict]:
    """The calls in text whose braces are doubled unevenly ({{"name": "f", "arguments": {"x": 1}}\n{{...}}}}):
    each "name" with the object after its "arguments"."""
    decoder, out = json.JSONDecoder(), []
    for m in _NAMED.finditer(text):
        rest = text[m.end():]
        for candidate in (rest, "{" + rest[2:] if rest.startswith("{{") else None):
            if candidate is None:
                continue
            try:
                args, _ = decoder.raw_decode(candidate)
            except ValueError:
                continue
            out.append({"name": m.group(1), "arguments": args})
            break
        else:
            return []
    return out


def _call(obj: Any) -> Optional[Call]:
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]  # OpenAI's own shape, {"type": "function", "function": {...}}
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[k] for k in _ARGS_KEYS if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        return None
    return {"name": obj["name"], "arguments": args}


def _calls(obj: Any, names: Optional[Collection[str]] = None) -> list[Call]:
    """The calls a JSON value is (an object or a list of them), each naming one of `names` when given; []
    when it is anything else."""
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call(item) for item in items]
    if not calls or any(c is None for c in calls):
        return []
    if names is not None and any(c["name"] not in names for c in calls):
        return []
    if names is not None and any(set(item) - _OBJECT_KEYS for item in items):
        return []  # unmarked JSON with keys no call has ({"name": ..., "age": 25}, an answer in a schema) is not one
    return calls


# -- finding calls in text -----------------------------------------------------------------------------

# What a candidate at a position turned out to be: a call (its end), text, or not decided yet (open).
_OPEN, _TEXT = "open", "text"


def _fence_body(text: str, start: int) -> tuple[str, Optional[int], Optional[int]]:
    """For a fence opening at `start`: (state, where its JSON body starts, where the fence ends). state is
    _OPEN (language line or body not complete), _TEXT (a language other than JSON's, or a body that is
    not JSON), or "body" (the language line is done and the body begins at the returned index)."""
    i = start + len(_FENCE)
    newline = text.find("\n", i)
    line = text[i:] if newline < 0 else text[i:newline]
    lang = line.strip().lower()
    if newline < 0:
        if lang.startswith(("{", "[")):  # ```{"name": ...}``` on one line
            return "body", i + len(line) - len(line.lstrip()), None
        return (_OPEN, None, None) if any(k.startswith(lang) for k in _FENCE_LANGS) else (_TEXT, None, None)
    if lang.startswith(("{", "[")):
        return "body", i + len(line) - len(line.lstrip()), None
    if lang not in _FENCE_LANGS:
        return _TEXT, None, None
    return "body", newline + 1, None


_HEAD = re.compile(r'(?:\[\s*)?\{\s*(?:\{\s*)?(?:"([A-Za-z_]*)(")?)?')


def _json_at(text: str, start: int, names: Optional[Collection[str]]) -> tuple[str, int, list[Call]]:
    """The call(s) written as a JSON value at text[start] (after blanks): ("call", end, calls), (_OPEN, ...)
    while it may still become one, or (_TEXT, ...) when it cannot."""
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    if i == len(text):
        return _OPEN, i, []
    if text[i] not in "{[":
        return _TEXT, i, []
    # The first key must be one a call begins with: prose in braces, or JSON about something else, is text.
    head = _HEAD.match(text, i)
    if head is None:  # '[' without an object after it
        return (_OPEN if not text[i + 1:].strip() else _TEXT), i, []
    key, closed, at_end = head.group(1), head.group(2), head.end() == len(text)
    if key is None:
        return (_OPEN if at_end else _TEXT), i, []
    if not closed:
        return (_OPEN if at_end and any(k.startswith(key) for k in _CALL_KEYS) else _TEXT), i, []
    if key not in _CALL_KEYS:
        return _TEXT, i, []
    end = _balanced_end(text, i)
    if end is None:
        return _OPEN, i, []
    calls = _calls(_loads(text[i:end]), names)
    if not calls:
        return _TEXT, i, []
    surplus = _SURPLUS.match(text, end)  # a brace too many after the call is the call's, not text
    return "call", surplus.end() if surplus else end, calls


def _complete_items(text: str, start: int, names: Optional[Collection[str]]) -> list[Call]:
    """The calls written whole at the head of a list opened at text[start] and never closed."""
    decoder, calls, i = json.JSONDecoder(), [], start + 1
    while True:
        i += len(re.match(r"[\s,]*", text[i:]).group(0))
        try:
            item, i = decoder.raw_decode(text, i)
        except ValueError:
            return calls
        found = _calls(item, names)
        if len(found) != 1:
            return calls
        calls += found


def _marker_at(text: str, start: int) -> Optional[str]:
    for m in _MARKERS:
        if text.startswith(m, start):
            return m
    return None


def _marked(text: str, start: int, marker: str) -> tuple[str, int, list[Call]]:
    """The call(s) after a family's marker: ("call", end, calls), (_OPEN, ...) or ("broken", ...)."""
    body_start = start + len(marker)
    if marker == "<tool_call>":
        close = text.find("</tool_call>", body_start)
        body = text[body_start:] if close < 0 else text[body_start:close]
        end = len(text) if close < 0 else close + len("</tool_call>")
        calls = _calls(_loads(_unfenced(body)))
        if close < 0 and not calls:
            return _OPEN, start, []
        return ("call", end, calls) if calls else ("broken", start, [])
    if marker == "[TOOL_CALLS]":
        rest = text[body_start:]
        named = re.match(r"\s*([A-Za-z0-9_.-]+)\[ARGS\]", rest)  # Mistral's newer [TOOL_CALLS]name[ARGS]{...}
        if named:
            args_at = body_start + named.end()
            end = _balanced_end(text, args_at) if text[args_at:args_at + 1] == "{" else None
            if end is None:
                return _OPEN, start, []
            args = _loads(text[args_at:end])
            return ("call", end, [{"name": named.group(1), "arguments": args}]) if isinstance(args, dict) else ("broken", start, [])
    state, end, calls = _json_at(text, body_start, None)
    if state == "call":
        return state, end, calls
    return (_OPEN, start, []) if state == _OPEN else ("broken", start, [])


def _unfenced(body: str) -> str:
    m = re.fullmatch(r"\s*```[A-Za-z_]*\s*(.*?)\s*(?:```)?\s*", body, re.S)
    return m.group(1) if m else body


_SPECIAL = re.compile(r"[<\[{`]")


def _scan(text: str, names: Optional[Collection[str]], final: bool):
    """Walk `text` for calls: yields (start, end, calls) for each call found, and (start, None, None) for
    the first place still open (only when not `final`: more text may come). A marker whose call is broken
    yields (start, -1, None)."""
    i, brace = 0, None
    while True:
        found = _SPECIAL.search(text, i)
        if found is None:
            return
        i = found.start()
        marker = _marker_at(text, i)
        if marker is not None:
            state, end, calls = _marked(text, i, marker)
            if state == "call":
                yield i, end, calls
                i = end
                continue
            if state == _OPEN and not final:
                yield i, None, None
                return
            yield i, -1, None
            return
        if not final and len(text) - i < 14 and any(m.startswith(text[i:]) for m in _MARKERS + (_FENCE,)):
            yield i, None, None  # a marker may be arriving
            return
        if text.startswith(_FENCE, i):
            state, body, _ = _fence_body(text, i)
            if state == "body":
                jstate, jend, calls = _json_at(text, body, names)
                while jstate == "call":  # several calls in one fence, one after another
                    more_state, more_end, more = _json_at(text, jend + len(re.match(r"[\s,]*", text[jend:]).group(0)), names)
                    if more_state != "call":
                        break
                    jend, calls = more_end, calls + more
                if jstate == "call":
                    close = re.match(r"\s*```", text[jend:])
                    if close:
                        yield i, jend + close.end(), calls
                        i = jend + close.end()
                        continue
                    if final or re.fullmatch(r"\s*`{0,2}", text[jend:]) is None:
                        yield i, jend, calls  # an unclosed fence: the call is what counts
                        i = jend
                        continue
                    yield i, None, None
                    return
                state = jstate
            if state == _OPEN and not final:
                yield i, None, None
                return
            # Not a call: the fenced block is code or text, passed over whole (a call-shaped dict in code is code).
            close = text.find("\n```", i + len(_FENCE))
            if close < 0:
                return
            i = close + 1 + len(_FENCE)
            continue
        if text[i] in "{[":
            state, end, calls = _json_at(text, i, names)
            if state == "call":
                # a brace doubled at the call's start only ({{"name": ..., "arguments": {...}}: Qwen copies its
                # template's example) is the call's, not text before it
                start = brace if brace is not None and not text[brace + 1:i].strip() else i
                yield start, end, calls
                i, brace = end, None
                continue
            if state == _OPEN and not final:
                yield i, None, None
                return
            if state == _OPEN and text[i] == "[":
                calls = _complete_items(text, i, names)
                if calls:  # a list of calls cut short (max_tokens): the calls written whole
                    yield i, len(text), calls
                    return
            brace = i if state == _OPEN and text[i] == "{" else None  # never closed: perhaps the first of a doubled pair
        i += 1


def parse_tool_calls(text: str, names: Optional[Collection[str]] = None) -> tuple[str, list[Call]]:
    """(the content left, the calls) in what the model wrote; each call {"name", "arguments": dict}.
    `names`: the tools offered (a call written without a family's marker must name one). Text that is not
    a well-formed call stays content: a model that meant to call and wrote broken JSON after a marker gets
    its text back rather than a call with made-up arguments."""
    calls: list[Call] = []
    kept, last = [], 0
    for start, end, found in _scan(text, names, final=True):
        if end == -1:
            return text, []
        kept.append(text[last:start])
        calls += found
        last = end
    if not calls:
        return text, []
    kept.append(text[last:])
    return joined(kept), calls


def safe_end(text: str, names: Optional[Collection[str]]) -> int:
    """How much of a streaming answer can no longer be part of a call: the first place one may begin (a
    marker, a fence, a call-shaped object), or the whole text."""
    return next((start for start, _, _ in _scan(text, names, final=False)), len(text))


def joined(parts: list[str]) -> str:
    """The text around calls as content: each piece trimmed (the answer's own leading blanks kept, as they went
    out while it streamed), joined by line breaks."""
    pieces = [p.strip() if i else p.rstrip() for i, p in enumerate(parts)]
    return "\n".join(p for p in pieces if p.strip())
