"""The JSON schema of a forced call (tool_choice "required" or a named function) in the generic shape,
{"name": ..., "arguments": {...}}: the form a forced call takes for a family without a format of its own (the
families' own forms are formats.grammar's). Reading calls is engine.formats' work."""

from __future__ import annotations

from typing import Any, Optional


def call_schema(tools: list[dict[str, Any]], name: Optional[str] = None, parallel: bool = False) -> dict[str, Any]:
    """The JSON schema of one call, {"name", "arguments"}, to one of `tools` (OpenAI's function tools), or
    to the one named: its arguments are that function's own parameters schema. `parallel`: a list of one
    or more such calls."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    # Each parameters schema becomes a part of this one: its references ('#/$defs/Loc', as pydantic writes
    # nested models) are moved to where it now lies, a copy of it kept under this schema's own $defs.
    defs: dict[str, Any] = {}
    options = []
    for i, f in enumerate(chosen):
        params = f.get("parameters") or {"type": "object", "properties": {}}
        if _refers(params):
            defs[f"tool{i}"] = params = _relocated(params, f"#/$defs/tool{i}")
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    one = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
    return {**schema, "$defs": defs} if defs else schema


def _refers(schema: Any) -> bool:
    """Whether a schema holds a $ref anywhere."""
    if isinstance(schema, dict):
        return isinstance(schema.get("$ref"), str) or any(_refers(v) for v in schema.values())
    return isinstance(schema, list) and any(_refers(v) for v in schema)


def _relocated(schema: Any, at: str) -> Any:
    """`schema` with its local references ('#', '#/...') pointing into it at `at`, where it is now kept."""
    if isinstance(schema, list):
        return [_relocated(v, at) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _relocated(v, at) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = at + ref[1:]
    return out


def supports_tools(template: Optional[str]) -> bool:
    """Whether a chat template renders the tools it is given (engine.formats.supports_tools)."""
    from .formats import supports_tools as renders_tools

    return renders_tools(template)
