"""Tool calls in a model's own format: which format a chat template uses, finding the calls in what the
model wrote, and the JSON schema that forces a call (tool_choice "required" or a named function).

Formats, told apart by the template's text (as llama.cpp's chat parsers are chosen):
  hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Hermes, Qwen 2.5/3,
           SmolLM3 and most recent templates)
  mistral  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
  llama3   {"name": ..., "parameters": {...}} (after <|python_tag|> or alone), Llama 3.1-3.3
  generic  a JSON object {"name", "arguments"} (or a list of them) as the whole answer: any other
           template, and the form a forced call is generated in
Pure functions: no llama.cpp here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

FAMILIES = ("hermes", "mistral", "llama3", "generic")


def template_family(template: Optional[str]) -> str:
    text = template or ""
    if "<tool_call>" in text:
        return "hermes"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3"
    return "generic"


def supports_tools(template: Optional[str]) -> bool:
    """Whether a chat template renders the tools it is given (it reads a `tools` variable)."""
    return bool(template) and re.search(r"\btools\b", template) is not None


_OPENERS = {"hermes": ("<tool_call>",), "mistral": ("[TOOL_CALLS]",), "llama3": ("<|python_tag|>", "{"), "generic": ("{", "[")}


def may_be_call(text: str, family: str) -> bool:
    """While an answer streams: could it still turn out to be a tool call? (Its start, blanks aside, is the
    start of one of the family's openers, or an opener is there.) Text that cannot is streamed as content."""
    head = text.lstrip()
    if not head:
        return True
    for opener in _OPENERS[family] + _OPENERS["generic"]:
        if head.startswith(opener) or opener.startswith(head):
            return True
    return False


def parse_tool_calls(text: str, family: str) -> tuple[str, list[dict[str, Any]]]:
    """(the content left, the calls) in what the model wrote; each call {"name", "arguments": dict}. Text
    that is not a well-formed call stays content: a model that meant to call and wrote broken JSON gets its
    text back rather than a call with made-up arguments."""
    if family == "hermes":
        calls, rest = [], text
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S):
            call = _call(_json(m.group(1)))
            if call is None:
                return text, []
            calls.append(call)
        if calls:
            rest = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.S).strip()
            return rest, calls
    elif family == "mistral" and "[TOOL_CALLS]" in text:
        before, _, after = text.partition("[TOOL_CALLS]")
        calls = _calls(_json(after.strip()))
        if calls:
            return before.strip(), calls
        return text, []
    elif family == "llama3":
        body = text.split("<|python_tag|>", 1)[1] if "<|python_tag|>" in text else text
        calls = _calls(_json(body.strip()), args_keys=("parameters", "arguments"))
        if calls:
            return "", calls
    calls = _calls(_json(text.strip()), args_keys=("arguments", "parameters"))  # the generic form, in any family
    return ("", calls) if calls else (text, [])


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> Optional[dict[str, Any]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _json(args)
    if not isinstance(args, dict):
        return None
    return {"name": obj["name"], "arguments": args}


def _calls(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> list[dict[str, Any]]:
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call(item, args_keys) for item in items]
    return calls if calls and all(c is not None for c in calls) else []


def call_schema(tools: list[dict[str, Any]], name: Optional[str] = None) -> dict[str, Any]:
    """The JSON schema of one call, {"name", "arguments"}, to one of `tools` (OpenAI's function tools), or
    to the one named: its arguments are that function's own parameters schema."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    options = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                  "arguments": f.get("parameters") or {"type": "object", "properties": {}}},
                "required": ["name", "arguments"], "additionalProperties": False} for f in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}
