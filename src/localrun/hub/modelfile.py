"""Ollama's Modelfile, read as Ollama documents it (docs/modelfile.md): one instruction a line, FROM first
by convention, a value to the end of the line or between quotes over several lines, `#` comment lines.

    FROM <model name or path>        PARAMETER <name> <value>       SYSTEM <text>
    TEMPLATE <text>                  MESSAGE <role> <text>          ADAPTER <path>
    LICENSE <text>                   REQUIRES <version>

This module only reads the text (plain data, no validation of values): runtime.models.create decides what each
instruction means for a localrun model and names what it cannot honour.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from ..errors import UsageError

INSTRUCTIONS = ("from", "parameter", "system", "template", "message", "adapter", "license", "requires")


@dataclass
class Modelfile:
    base: Optional[str] = None  # FROM
    parameters: list[tuple[str, str]] = field(default_factory=list)  # PARAMETER name value, in order (stop repeats)
    system: Optional[str] = None
    template: Optional[str] = None
    messages: list[dict] = field(default_factory=list)  # MESSAGE role text
    adapters: list[str] = field(default_factory=list)
    license: Optional[str] = None
    requires: Optional[str] = None


class ModelfileError(UsageError):
    def __init__(self, line: int, reason: str):
        self.line, self.reason = line, reason
        super().__init__(f"Modelfile line {line}: {reason}")


def parse_modelfile(text: str) -> Modelfile:
    """The instructions of a Modelfile's text. ModelfileError names the line of the first mistake."""
    out = Modelfile()
    for number, keyword, head, value, quoted in _instructions(text):
        kind = keyword.lower()
        value = value if quoted else _unquoted(value, escapes=kind == "parameter")
        if kind == "parameter" and not value:
            raise ModelfileError(number, f"PARAMETER {head} needs a value: PARAMETER NAME VALUE".replace("  ", " "))
        if not value and kind not in ("system", "template", "license", "message", "parameter"):
            raise ModelfileError(number, f"{kind.upper()} needs a value")
        if kind == "from":
            if _COMMENT.search(value):
                raise ModelfileError(number, f"FROM {value!r}: a # starts a comment only at the start of a line; put "
                                             "the comment on a line of its own")
            out.base = value
        elif kind == "parameter":
            out.parameters.append((head.lower(), value))
        elif kind == "message":
            out.messages.append({"role": head.lower(), "content": value})
        elif kind == "adapter":
            out.adapters.append(value)
        elif kind == "license":  # each LICENSE adds one (a model may carry several), as Ollama keeps them
            out.license = value if out.license is None else f"{out.license}\n\n{value}"
        else:  # system, template, requires: the last one given counts
            setattr(out, kind, value)
    return out


_COMMENT = re.compile(r"\s#")


def _instructions(text: str):
    """(line number, keyword, head, value, triple-quoted) per instruction, as Ollama's parser reads them: the
    keyword, then for PARAMETER its name and for MESSAGE its role (the head), separated by spaces or tabs; the
    value to the end of the line, or over several lines between \"\"\" or between " (Ollama writes a multi-line
    value without quotes in it that way). A UTF-8 byte-order mark at the start is skipped."""
    lines = text.removeprefix("\ufeff").splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        keyword, value = _word(line)
        kind = keyword.lower()
        if kind not in INSTRUCTIONS:
            raise ModelfileError(number, f"unknown instruction {keyword!r}: one of {', '.join(k.upper() for k in INSTRUCTIONS)}")
        head = ""
        if kind in ("parameter", "message"):
            head, value = _word(value)
            if kind == "message" and head.lower() not in ("system", "user", "assistant"):
                raise ModelfileError(number, f"MESSAGE role {head!r}: one of system, user, assistant")
        quoted = value.startswith('"""')
        if quoted:
            body = value[3:]
            while '"""' not in body:
                if i >= len(lines):
                    raise ModelfileError(number, f'{keyword.upper()}: the """ opened here is never closed')
                body += "\n" + lines[i]
                i += 1
            value, _, after = body.partition('"""')
            if after.strip():
                raise ModelfileError(number, f'{keyword.upper()}: text after the closing """: {after.strip()!r}')
        elif value.startswith('"'):
            while len(value) < 2 or not value.endswith('"'):
                if i >= len(lines):
                    raise ModelfileError(number, f'{keyword.upper()}: the " opened here is never closed')
                value += "\n" + lines[i].rstrip()
                i += 1
        yield number, keyword, head, value, quoted


def _word(text: str) -> tuple[str, str]:
    """The first word of `text` and the rest, split at the first run of spaces or tabs."""
    parts = text.split(None, 1)
    return (parts[0], parts[1].strip()) if len(parts) == 2 else (text.strip(), "")


def _unquoted(value: str, escapes: bool = False) -> str:
    """A "quoted" value's text: the quotes stripped, as Ollama's parser does (a Windows path or a regex in a
    system prompt stays as written); `escapes`: a PARAMETER's, whose escapes (\\n, \\") are read as JSON reads
    them where they are valid (show --modelfile writes a stop sequence with a line break so)."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        if escapes:
            try:
                return json.loads(value)
            except ValueError:
                pass
        return value[1:-1]
    return value
