"""Ollama's endpoints that make models: /api/create (its JSON fields, or an older client's Modelfile text)
and /api/copy, translated into runtime.create's Modelfile. What localrun cannot honour is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

from ..errors import UsageError
from ..runtime.create import Modelfile, parse_modelfile
from .errors import ApiError

_CREATE_FIELDS = {"model", "name", "from", "modelfile", "parameters", "system", "template", "messages", "license", "stream",
                  "files", "adapters", "quantize", "quantization", "path"}
_REFUSED = {
    "files": "files (uploaded GGUF blobs): give `from` a model name or a .gguf path on the server",
    "adapters": "adapters (LoRA adapters) are not supported by localrun yet",
    "quantize": "quantize: make the quant with `localrun quantize` and create from it",
    "quantization": "quantize: make the quant with `localrun quantize` and create from it",
    "path": "path (a Modelfile on the server): send its text as `modelfile`",
}


def create_request(data: Any) -> tuple[str, Modelfile, bool]:
    """The model's name, its Modelfile and whether to stream, from an /api/create body. ApiError(400) names
    what is wrong."""
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    name = data.get("model") or data.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required: the name of the model to create")
    for field, why in _REFUSED.items():
        if data.get(field):
            raise ApiError(400, why)
    text = data.get("modelfile")
    if text is not None and not isinstance(text, str):
        raise ApiError(400, "modelfile must be a string (a Modelfile's text)")
    try:
        made = parse_modelfile(text) if text else Modelfile()
    except UsageError as exc:  # ModelfileError: its line and reason
        raise ApiError(400, exc.message) from None
    base = data.get("from")
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ApiError(400, "from must be a model name or a .gguf path")
        made.base = base
    if not made.base:
        raise ApiError(400, "neither 'from' nor a modelfile with FROM was given: name the model to create from")
    for field in ("system", "template"):
        if data.get(field) is not None:
            if not isinstance(data[field], str):
                raise ApiError(400, f"{field} must be a string")
            setattr(made, field, data[field])
    license_ = data.get("license")
    if license_ is not None:
        if isinstance(license_, list) and all(isinstance(x, str) for x in license_):
            license_ = "\n".join(license_)
        if not isinstance(license_, str):
            raise ApiError(400, "license must be a string or a list of strings")
        made.license = license_
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(400, "parameters must be an object of Ollama's option names")
    for pname, value in parameters.items():
        for one in value if isinstance(value, list) and pname == "stop" else [value]:
            made.parameters.append((pname.lower(), _text(one)))
    messages = data.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                    and m.get("role") in ("system", "user", "assistant") for m in messages):
            raise ApiError(400, "messages must be a list of {role: system|user|assistant, content: text}")
        made.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    for field in sorted(set(data) - _CREATE_FIELDS):
        from .ollama import ignored

        ignored("/api/create", f"the field {field!r}")
    return name, made, data.get("stream", True) is not False


def _text(value: Any) -> str:
    """A JSON parameter value as a Modelfile's PARAMETER line writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def copy_request(data: Any) -> tuple[str, str]:
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    source, destination = data.get("source"), data.get("destination")
    for field, value in (("source", source), ("destination", destination)):
        if not isinstance(value, str) or not value:
            raise ApiError(400, f"{field} is required: a model name")
    return source, destination
