"""JSON as a model writes it, whole or cut short: where a value ends, the members of an object written so far,
a Python literal or a loose object read as JSON. Pure functions."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any, Optional

_DECODER = json.JSONDecoder()
_BLANK = " \t\r\n"


def skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in _BLANK:
        i += 1
    return i


def value_end(text: str, start: int) -> Optional[int]:
    """The end (exclusive) of the JSON value at text[start]; None while it is still open (more text may close
    it) or when no value starts there. Strings are respected; brackets need only balance."""
    if start >= len(text):
        return None
    c = text[start]
    if c in "{[":
        depth, in_string, escaped = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
        return None
    if c == '"':
        escaped = False
        for i in range(start + 1, len(text)):
            if escaped:
                escaped = False
            elif text[i] == "\\":
                escaped = True
            elif text[i] == '"':
                return i + 1
        return None
    m = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null").match(text, start)
    if m is None or m.end() == len(text):  # a number may go on
        return None
    return m.end()


def loads(text: str) -> Any:
    """JSON, or None where it is not."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def members(text: str, start: int) -> Iterator[tuple[str, int, Optional[int]]]:
    """The members of the object opening at text[start] ('{'), as far as they are written: (key, where its value
    starts, where it ends or None while open). Stops at the object's end or where the text stops making sense."""
    i = skip_blank(text, start + 1)
    while i < len(text):
        if text[i] == "}":
            return
        if text[i] == ",":
            i = skip_blank(text, i + 1)
            continue
        if text[i] != '"':
            return
        end = value_end(text, i)
        if end is None:
            return
        try:
            key = json.loads(text[i:end])
        except ValueError:
            return
        i = skip_blank(text, end)
        if i >= len(text) or text[i] != ":":
            return
        i = skip_blank(text, i + 1)
        if i >= len(text):
            return
        vend = value_end(text, i)
        yield key, i, vend
        if vend is None:
            return
        i = skip_blank(text, vend)


def python_literal(text: str) -> Any:
    """A value written the Python way (True, None, 'single quotes', (tuples)) as JSON's; raises ValueError."""
    value = ast.literal_eval(text.strip())
    if isinstance(value, tuple):
        value = list(value)
    json.dumps(value)  # only what JSON can carry
    return value


def scalar(text: str) -> Any:
    """A parameter written as text (a tagged format's value): JSON where it reads as JSON, else a Python
    literal, else the text itself."""
    stripped = text.strip()
    value = loads(stripped)
    if value is not None or stripped == "null":
        return value
    try:
        return python_literal(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def string_body(text: str) -> str:
    """`text` as it appears inside a JSON string (escaped, without the quotes): streamed a piece at a time, the
    pieces join into the whole string's body."""
    return json.dumps(text, ensure_ascii=False)[1:-1]
