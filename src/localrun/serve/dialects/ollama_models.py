"""Ollama's endpoints that make models: /api/create (its JSON fields, or an older client's Modelfile text)
and /api/copy, translated into runtime.models.create's Modelfile. What localrun cannot honour is a 400 naming it.
Pure: no HTTP here (serve/routes/ollama.py serves them)."""

from __future__ import annotations

import json
from typing import Any

from ...errors import UsageError
from ...runtime.models.create import Modelfile, blob_adapters, parse_modelfile
from ..checks import need
from ..errors import Refused
from .ollama import ignored

_CREATE_FIELDS = {"model", "name", "from", "modelfile", "parameters", "system", "template", "messages", "license", "stream",
                  "files", "adapters", "quantize", "quantization", "path"}
_REFUSED = {
    "files": "files (uploaded GGUF blobs): give `from` a model name or a .gguf path on the server",
    "quantize": "quantize: make the quant with `localrun quantize` and create from it",
    "quantization": "quantize: make the quant with `localrun quantize` and create from it",
    "path": "path (a Modelfile on the server): send its text as `modelfile`",
}


def create_request(data: Any) -> tuple[str, Modelfile, bool]:
    """The model's name, its Modelfile and whether to stream, from an /api/create body. Refused names
    what is wrong."""
    need(isinstance(data, dict), "the body must be a JSON object")
    name = data.get("model") or data.get("name")
    need(isinstance(name, str) and bool(name), "model is required: the name of the model to create")
    for field, why in _REFUSED.items():
        need(not data.get(field), why)
    made = _modelfile(data)
    for field in ("system", "template"):
        if data.get(field) is not None:
            need(isinstance(data[field], str), f"{field} must be a string")
            setattr(made, field, data[field])
    license_ = data.get("license")
    if license_ is not None:
        if isinstance(license_, list) and all(isinstance(x, str) for x in license_):
            license_ = "\n".join(license_)
        need(isinstance(license_, str), "license must be a string or a list of strings")
        made.license = license_
    made.parameters += _parameters(data.get("parameters") or {})
    adapters = data.get("adapters")
    if adapters:  # LoRA adapters' GGUFs uploaded with /api/blobs, as a Modelfile's ADAPTER lines (checked as those)
        need(isinstance(adapters, dict), 'adapters must be an object: {"FILE.gguf": "sha256:DIGEST"}')
        try:
            made.adapters += blob_adapters(adapters)
        except UsageError as exc:
            raise Refused(exc.message) from None
    messages = data.get("messages")
    if messages is not None:
        need(isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                and m.get("role") in ("system", "user", "assistant") for m in messages),
             "messages must be a list of {role: system|user|assistant, content: text}")
        made.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    for field in sorted(set(data) - _CREATE_FIELDS):
        ignored("/api/create", f"the field {field!r}")
    return name, made, data.get("stream", True) is not False


def _modelfile(data: dict) -> Modelfile:
    """An older client's Modelfile text, with the model it is made `from`."""
    text = data.get("modelfile")
    need(text is None or isinstance(text, str), "modelfile must be a string (a Modelfile's text)")
    try:
        made = parse_modelfile(text) if text else Modelfile()
    except UsageError as exc:  # ModelfileError: its line and reason
        raise Refused(exc.message) from None
    base = data.get("from")
    if base is not None:
        need(isinstance(base, str) and bool(base), "from must be a model name or a .gguf path")
        made.base = base
    need(bool(made.base), "neither 'from' nor a modelfile with FROM was given: name the model to create from")
    return made


def _parameters(parameters: Any) -> list[tuple[str, str]]:
    """Ollama's `parameters` object as a Modelfile's PARAMETER lines (each stop a line of its own)."""
    need(isinstance(parameters, dict), "parameters must be an object of Ollama's option names")
    return [(name.lower(), _text(one)) for name, value in parameters.items()
            for one in (value if isinstance(value, list) and name == "stop" else [value])]


def _text(value: Any) -> str:
    """A JSON parameter value as a Modelfile's PARAMETER line writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def copy_request(data: Any) -> tuple[str, str]:
    need(isinstance(data, dict), "the body must be a JSON object")
    source, destination = data.get("source"), data.get("destination")
    for field, value in (("source", source), ("destination", destination)):
        need(isinstance(value, str) and bool(value), f"{field} is required: a model name")
    return source, destination
