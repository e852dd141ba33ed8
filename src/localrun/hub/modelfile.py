"""Ollama's Modelfile, read as Ollama documents it (docs/modelfile.md): one instruction a line, FROM first
by convention, a value to the end of the line or between triple quotes over several lines, `#` comments.

    FROM <model name or path>        PARAMETER <name> <value>       SYSTEM <text>
    TEMPLATE <text>                  MESSAGE <role> <text>          ADAPTER <path>
    LICENSE <text>                   REQUIRES <version>

This module only reads the text (plain data, no validation of values): runtime.create decides what each
instruction means for a localrun model and names what it cannot honour.
"""

from __future__ import annotations

import json
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
    for number, keyword, value, quoted in _instructions(text):
        value = value if quoted else _unquoted(value)
        kind = keyword.lower()
        if kind not in INSTRUCTIONS:
            raise ModelfileError(number, f"unknown instruction {keyword!r}: one of {', '.join(k.upper() for k in INSTRUCTIONS)}")
        if not value and kind not in ("system", "template", "license"):
            raise ModelfileError(number, f"{kind.upper()} needs a value")
        if kind == "from":
            out.base = value
        elif kind == "parameter":
            name, _, rest = value.partition(" ")
            if not rest.strip():
                raise ModelfileError(number, f"PARAMETER {name} needs a value: PARAMETER NAME VALUE")
            out.parameters.append((name.strip().lower(), _unquoted(rest.strip())))
        elif kind == "message":
            role, _, content = value.partition(" ")
            if role.lower() not in ("system", "user", "assistant"):
                raise ModelfileError(number, f"MESSAGE role {role!r}: one of system, user, assistant")
            out.messages.append({"role": role.lower(), "content": _unquoted(content.strip())})
        elif kind == "adapter":
            out.adapters.append(value)
        else:  # system, template, license, requires: the last one given counts
            setattr(out, kind, value)
    return out


def _instructions(text: str):
    """(line number, keyword, value, triple-quoted) per instruction; a triple-quoted value runs to its closing
    quotes."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        keyword, _, value = line.partition(" ")
        value, quoted = value.strip(), value.strip().startswith('"""')
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
        yield number, keyword, value, quoted


def _unquoted(value: str) -> str:
    """A "quoted" value's text, its escapes (\\n, \\") read as JSON reads them where they are valid."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return json.loads(value)
        except ValueError:
            return value[1:-1]
    return value
