"""The grammar of a forced call (tool_choice "required" or a named function) written in the family's own
format: its markers around the arguments, the arguments held to each tool's schema, so that a real model writes
what it was trained on and the family's reader reads it back. A reasoning family may think first, as
llama.cpp's grammars let it (its thinking markers around free text). Families without a format of their own
are forced in the generic JSON call (engine.tools.call_schema)."""

from __future__ import annotations

import re
from typing import Any, Optional

from .special import FunctionaryV32, Gemma4, Pythonic
from .syntax import WS, Cap, JsonCalls, NameArgs, Opt, Tagged


def forced_grammar(family, tools: list[dict[str, Any]], name: Optional[str] = None, parallel: bool = False,
                   think: bool = True) -> Optional[str]:
    """GBNF for one call (or, `parallel`, one or more) to one of `tools` (OpenAI function tools), or to the one
    named, in `family`'s format; None when the family has none of its own. `think`: a reasoning family may think
    first (not when the request turned its thinking off)."""
    from ..json_schema import json_schema_to_gbnf
    from ..tools import call_schema

    syntax = family.calls
    if syntax is None or isinstance(syntax, (FunctionaryV32, Pythonic, Gemma4)):
        return None
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    g = _Grammar(json_schema_to_gbnf)
    if isinstance(syntax, JsonCalls):
        keys = {"name": syntax.name_keys[0], "arguments": syntax.args_keys[0]}
        # a list where the family writes its calls as one (Mistral, Nemotron, Command R), else one object a section
        schema = call_schema([{"type": "function", "function": f} for f in chosen], None, parallel=syntax.list_only)
        schema = _keys_renamed(schema, keys, syntax.name_as_key)
        body = g.json(schema, "call")
        section = f"{_lit(syntax.open)} space-nl {body}" + (f" space-nl {_lit(syntax.close)}" if syntax.close else "")
        calls = section if not parallel or syntax.list_only else f"{section} (space-nl {section})*"
    else:
        one = " | ".join(g.rule(f"call-{i}", _call(g, syntax, f, i)) for i, f in enumerate(chosen))
        calls = f"({one})" + (f" (space-nl ({one}))*" if parallel else "")
        if syntax.section_open:
            calls = f"{_lit(syntax.section_open)} space-nl {calls}" + (f" space-nl {_lit(syntax.section_close)}" if syntax.section_close else "")
    thinking = family.thinking if think else None
    think = ""
    if thinking is not None:
        body = g.excluding(thinking.close, "think-text")
        opener = _lit(thinking.open)
        think = f"({opener}? {body} {_lit(thinking.close)} space-nl)? "
    g.add("root", think + calls)
    g.add("space-nl", '[ \\n]{0,2}')
    return g.text()


def _call(g: "_Grammar", syntax, function: dict, i: int) -> str:
    """One call of a NameArgs or Tagged syntax to `function`."""
    name = function["name"]
    head = " ".join(_item(item, name) for item in syntax.header)
    params = function.get("parameters") or {"type": "object", "properties": {}}
    if isinstance(syntax, NameArgs):
        args = g.json(params, f"args-{i}")
        if syntax.fenced:
            args = f'"```json\\n" {args} "\\n```"'
        return f"{head} {args}" + (f" {_lit(syntax.call_close)}" if syntax.call_close else "")
    assert isinstance(syntax, Tagged)
    props = params.get("properties") or {}
    required = [k for k in params.get("required") or [] if k in props]
    optional = [k for k in props if k not in required]
    parts = []
    for key in [*required, *optional]:
        arg_head = " ".join(_item(item, name, key=key, schema=props[key]) for item in syntax.arg)
        close = syntax.arg_close.replace("{key}", key)
        kinds = _kinds(props[key])
        if kinds == {"string"} or not kinds:
            value = g.excluding(close, f"text-{i}", props[key].get("maxLength") if isinstance(props[key], dict) else None)
            if syntax.trim_newline:
                value = f'"\\n" {value} "\\n"'
        else:
            value = g.json(props[key], f"value-{i}-{_rule_name(key)}")
            if syntax.trim_newline:
                value = f'"\\n" {value} "\\n"'
        arg = f"space-nl {arg_head} {value} {_lit(close)}"
        parts.append(f"({arg})" + ("" if key in required else "?"))
    return f"{head} {' '.join(parts)} space-nl {_lit(syntax.call_close)}"


def _item(item, name: str, key: Optional[str] = None, schema: Optional[dict] = None) -> str:
    if item == WS:
        return "[ \\n]?"
    if isinstance(item, str):
        return _lit(item)
    if isinstance(item, Opt):
        return f"{_lit(item.text)}?"
    assert isinstance(item, Cap)
    if item.name == "name":
        return _lit(name)
    if item.name == "key":
        return _lit(key or "")
    if item.name == "id":
        if "functions." in str(item.until) or "argument" in str(item.until):
            return f'{_lit("functions." + name + ":")} [0-9]{{1,3}}'
        return "[a-zA-Z0-9]{9}"
    if item.name == "string":
        return _lit("true" if _kinds(schema or {}) == {"string"} else "false")
    if item.name == "channel":
        return _lit("commentary")
    return '[a-z]+'


def _kinds(schema: dict) -> set[str]:
    from .syntax import _types

    return _types(schema) if isinstance(schema, dict) else set()


def _keys_renamed(schema: Any, keys: dict, name_as_key: bool) -> Any:
    """call_schema's {"name", "arguments"} objects with the family's own keys (or {NAME: arguments})."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and set(schema.get("properties", {})) == {"name", "arguments"}:
            props = schema["properties"]
            if name_as_key:
                fn = props["name"]["const"]
                return {"type": "object", "properties": {fn: props["arguments"]}, "required": [fn], "additionalProperties": False}
            return {**schema, "properties": {keys["name"]: props["name"], keys["arguments"]: props["arguments"]},
                    "required": [keys["name"], keys["arguments"]]}
        return {k: _keys_renamed(v, keys, name_as_key) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_keys_renamed(v, keys, name_as_key) for v in schema]
    return schema


def _lit(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def _rule_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9-]+", "-", text) or "x"


class _Grammar:
    """Rules gathered from several JSON schemas (each converted apart, its rules renamed under a prefix) and
    written by hand."""

    def __init__(self, convert):
        self.convert = convert
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> None:
        self.rules[name] = body

    def rule(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def json(self, schema: dict, prefix: str) -> str:
        """The rule of a value held to `schema`; its helper rules kept under `prefix`."""
        text = self.convert(schema)
        names = re.findall(r"^([a-zA-Z0-9-]+) ::=", text, re.M)
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z0-9-]+) ::= (.*)$", line)
            if m:
                self.rules[f"{prefix}-{m.group(1)}"] = _renamed(m.group(2), names, prefix)
        return f"{prefix}-root"

    def excluding(self, stop: str, name: str, most: Optional[int] = None) -> str:
        """A rule for any text that does not contain `stop` (it cannot end inside a start of it either); `most`:
        at most that many pieces (a schema's maxLength, counted in characters but for a start of `stop`)."""
        rule = f"{name}-{_rule_name(stop)}"
        many = "*" if most is None else f"{{0,{int(most)}}}"
        if f"{rule}-0" in self.rules:
            return f"{rule}-0{many}"
        chars = [c for c in stop]
        first = _class_char(chars[0])
        self.rules[f"{rule}-0"] = f"[^{first}] | {_lit(chars[0])} {rule}-1" if len(chars) > 1 else f"[^{first}]"
        for k in range(1, len(chars)):
            c = _class_char(chars[k])
            nxt = f" | {_lit(chars[k])} {rule}-{k + 1}" if k + 1 < len(chars) else ""
            self.rules[f"{rule}-{k}"] = f"[^{c}{first}] | {_lit(chars[0])} {rule}-1{nxt}"
        return f"{rule}-0{many}"

    def text(self) -> str:
        return "\n".join(f"{k} ::= {v}" for k, v in self.rules.items()) + "\n"


def _class_char(c: str) -> str:
    return {"\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, c)


def _renamed(body: str, names: list[str], prefix: str) -> str:
    """A rule's body with its references to `names` prefixed (text in quotes and classes left alone)."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            j = i + 1
            while j < len(body) and body[j] != '"':
                j += 2 if body[j] == "\\" else 1
            out.append(body[i:j + 1])
            i = j + 1
        elif c == "[":
            j = i + 1
            while j < len(body) and body[j] != "]":
                j += 2 if body[j] == "\\" else 1
            out.append(body[i:j + 1])
            i = j + 1
        elif re.match(r"[a-zA-Z0-9-]", c) and (i == 0 or not re.match(r"[a-zA-Z0-9-]", body[i - 1])):
            m = re.compile(r"[a-zA-Z0-9-]+").match(body, i)
            word = m.group(0)
            out.append(f"{prefix}-{word}" if word in names else word)
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)
