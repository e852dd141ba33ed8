"""What every dialect writes and reads on the wire, with nothing of any dialect in it: a request body's JSON
(strict: no NaN, no lone surrogate), one server-sent event, one line of NDJSON."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadJson(ValueError):
    pass


def parse_json(raw: bytes) -> Any:
    """A request body's JSON: strict JSON (NaN and Infinity are not), and no lone UTF-16 surrogate in any
    string (it cannot be written back as UTF-8, to a log, a tokenizer or an answer). BadJson names why."""
    def constant(name: str):
        raise BadJson(f"{name} is not a JSON value: send a number")

    try:
        data = json.loads(raw, parse_constant=constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadJson(str(exc)) from None
    except RecursionError:
        raise BadJson("nested too deeply") from None
    if _SURROGATE.search(raw):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadJson("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff not in a pair): send valid Unicode") from None
    return data


def sse(name: Optional[str], data: dict) -> str:
    """One server-sent event (`event: NAME` where the dialect names its events)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def ndjson(obj: dict) -> str:
    """One line of a JSON Lines stream."""
    return json.dumps(obj, ensure_ascii=False) + "\n"
