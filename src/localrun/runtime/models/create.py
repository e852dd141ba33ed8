"""Models made here from others, as Ollama makes them: `create NAME -f Modelfile` and /api/create (FROM a
pulled model or a .gguf file, with its own PARAMETERs, SYSTEM, TEMPLATE and MESSAGEs), `cp` and /api/copy.

A made model shares its files with what it was made from (nothing is copied) and keeps its own defaults
(hub.ModelDefaults) in the registry, so `list`, /api/tags and /v1/models show it whether loaded or not and
every entry point runs it by its name. ADAPTER names a LoRA adapter's GGUF (FILE or FILE:SCALE, relative to the
Modelfile's folder), checked against the base model as the model is made and loaded with it every time. What
localrun cannot honour is refused or noticed in one line naming it: an ADAPTER that is no LoRA GGUF or made for
another model, a TEMPLATE in Ollama's Go syntax (localrun renders Jinja chat templates).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from ...errors import UsageError
from ...hub.modelfile import Modelfile, ModelfileError, parse_modelfile
from ..failures import flag
from ..options import OLLAMA_IGNORED, OLLAMA_LOAD, OLLAMA_RENAMED, ollama_name

__all__ = ["Modelfile", "ModelfileError", "blob_adapters", "blob_path", "copy_model", "create_model", "parse_modelfile"]

_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")  # (fullmatch: `$` would take a trailing newline)

# The load settings a PARAMETER sets, in words: a notice is read on the command line and by /api/create's clients
# alike, so it names both ways of setting them (the flag, runtime.failures.flag; the request's option)
_LOAD_WORDS = {"gpu_layers": "GPU layer count", "threads": "thread count", "batch": "batch size"}


def create_model(name: str, modelfile, *, base_dir: Optional[Path] = None, source: str = "auto",
                 progress: Any = False, on_notice: Optional[Callable[[str], None]] = None):
    """Register `name` as the model `modelfile` (hub.Modelfile) describes; returns its hub.LocalModel. A FROM
    that names a model not pulled yet is pulled first; a relative FROM path is read from `base_dir` (the
    Modelfile's folder). Every value is checked before anything is pulled or written."""
    from ... import hub

    say = on_notice or (lambda _: None)
    name = hub.created_name(name)
    if not modelfile.base:
        raise UsageError("the Modelfile has no FROM line: FROM a model name (`localrun list`) or a .gguf file")
    adapters = _adapters(modelfile.adapters, base_dir)
    base_ref = _base_ref(modelfile.base, base_dir)
    base = hub.defaults_for(base_ref)
    sampling, context = _parameters(modelfile.parameters, base, say)
    template = base.template
    if modelfile.template:
        template = _template(modelfile.template, say)
    if modelfile.requires:
        say(f"ignoring REQUIRES {modelfile.requires} (an Ollama version)")
    defaults = replace(base, sampling=sampling, context=context, template=template,
                       system=modelfile.system if modelfile.system is not None else base.system,
                       messages=tuple(modelfile.messages) or base.messages,
                       license=modelfile.license if modelfile.license is not None else base.license,
                       adapters=tuple(base.adapters) + adapters)
    local = hub.ensure_local(base_ref, source=source, progress=progress)
    if local.source == "path":  # a file of the user's own: whole and a GGUF model, or no model is made of it
        _check_file(local.path)
    if adapters:
        from ..lora import AdapterError, check_adapters

        try:
            check_adapters(adapters, local.path)
        except AdapterError as exc:  # an uploaded one (/api/create's adapters) by its digest, not the server's path
            digest = _DIGEST.fullmatch(exc.path.name)
            if digest is None or exc.path.parent != blob_path(exc.path.name).parent:
                raise
            raise UsageError(f"adapters: sha256:{digest.group(1)}: {exc.reason}") from None
    return hub.register_created(name, local, defaults, origin=f"FROM {local.ref if local.source != 'path' else local.path}")


def blob_path(digest: str) -> Path:
    """Where the file uploaded as `digest` (Ollama's sha256:HEX, POST /api/blobs/DIGEST) is kept: one file per digest
    under localrun's folder. UsageError for a digest that is not sha256:HEX."""
    from ...store.paths import home

    m = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise UsageError(f"invalid digest {digest!r}: give sha256: and the file's 64 hex digits")
    return home() / "blobs" / f"sha256-{m.group(1)}"


def blob_adapters(adapters: dict) -> list[str]:
    """Ollama's /api/create `adapters` ({"file.gguf": "sha256:HEX"}, each uploaded with /api/blobs) as ADAPTER lines:
    the blobs' paths, each checked to be there and a LoRA adapter's GGUF (UsageError naming the file as the client
    named it and its digest, never the server's path)."""
    from ..lora import AdapterError, read_adapter

    out = []
    for name, digest in adapters.items():
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise UsageError(f"adapters: {name!r}: {digest!r} is no digest: give the uploaded file's sha256:HEX")
        path = blob_path(digest)
        if not path.is_file():
            raise UsageError(f"adapters: {name!r}: no blob {digest} here: upload the file first (POST /api/blobs/{digest})")
        try:
            read_adapter(path)
        except AdapterError as exc:  # (its first bytes, a Python repr, say nothing to a client)
            raise UsageError(f"adapters: {name!r} ({digest}): {re.sub(r' [(]starts with .*[)]$', '', exc.reason)}") from None
        out.append(str(path))
    return out


def copy_model(source: str, destination: str):
    """`cp SOURCE DESTINATION`: DESTINATION runs as SOURCE does (its files, its defaults) under its own name."""
    from ... import hub

    name = hub.created_name(destination)
    local = hub.resolve_local(source)
    return hub.register_created(name, local, hub.defaults_for(source), origin=f"copy of {local.ref}")


def _check_file(path: Path) -> None:
    """FROM a file: one that llama.cpp could not load (not a GGUF, cut short, a corrupt header) is refused
    now, in one line, rather than at the first run (it was made, then listed by `list` but not /api/tags)."""
    from ...engine.gguf_info import read_info
    from ...errors import InvalidModelFile

    try:
        read_info(path)
    except InvalidModelFile as exc:
        reason = exc.message.rsplit(": ", 1)[0]  # (its advice, to pull again, is for a pulled file)
        raise UsageError(f"FROM {reason}: give FROM a complete .gguf model file") from None


def _adapters(given: list[str], base_dir: Optional[Path]) -> tuple[tuple[str, float], ...]:
    """ADAPTER lines as (absolute path, scale) pairs, each a LoRA adapter's GGUF (an Ollama ADAPTER of safetensors
    is refused: llama.cpp loads GGUF adapters only)."""
    from ..lora import AdapterError, parse_adapters

    try:
        return parse_adapters(given, base_dir)
    except AdapterError as exc:
        raise UsageError(f"ADAPTER {exc.path}: {exc.reason}") from None


def _base_ref(base: str, base_dir: Optional[Path]) -> str:
    """FROM's text as a reference: a path relative to the Modelfile's folder where such a file is there."""
    path = Path(base).expanduser()
    if base_dir is not None and not path.is_absolute() and (base_dir / path).is_file():
        return str((base_dir / path).resolve())
    return base


def _parameters(parameters: list[tuple[str, str]], base, say) -> tuple[dict[str, Any], Optional[int]]:
    """PARAMETER lines over the base's sampling defaults (localrun's names), and the context num_ctx sets."""
    from ..options import BY_NAME, OptionError, merge_options, text_value

    sampling, context, stops = dict(base.sampling), base.context, []
    for raw_name, value in parameters:
        name = OLLAMA_RENAMED.get(raw_name, raw_name)
        if name == "stop":
            stops.append(value)
        elif name in OLLAMA_LOAD:
            if OLLAMA_LOAD[name] != "ctx":
                setting = OLLAMA_LOAD[name]
                say(f"ignoring PARAMETER {raw_name}: a made model keeps no {_LOAD_WORDS[setting]}; set it where it runs ({flag(setting)} on the"
                    f" command line, options.{name} in a request)")
                continue
            try:
                context = int(value)
            except ValueError:
                raise UsageError(f"invalid PARAMETER num_ctx {value!r}: a whole number of tokens") from None
            if not 16 <= context <= 1 << 21:
                raise UsageError(f"invalid PARAMETER num_ctx {context}: between 16 and {1 << 21} tokens")
        elif name in OLLAMA_IGNORED:
            say(f"ignoring PARAMETER {raw_name}, which localrun (as recent Ollama) does not use")
        elif name == "draft_num_predict":  # Ollama's cap on its draft model's tokens a step
            say(f"ignoring PARAMETER {raw_name}: a made model keeps no draft settings; set them where it runs ({flag('draft_max')}"
                " on the command line)")
        elif name in BY_NAME:
            try:
                sampling[name] = text_value(name, value)
            except ValueError as exc:
                raise UsageError(f"invalid PARAMETER {raw_name} {value!r}: {exc}") from None
        else:
            raise UsageError(f"unknown PARAMETER {raw_name!r}: one of {', '.join(sorted({*BY_NAME, *OLLAMA_RENAMED, *OLLAMA_LOAD} - set(OLLAMA_RENAMED.values())))}")
    if stops:
        sampling["stop"] = stops
    try:
        checked = merge_options(sampling)
    except OptionError as exc:
        raise UsageError(exc.worded(lambda setting: f"PARAMETER {ollama_name(setting)}")) from None
    return {k: getattr(checked, k) for k in sampling}, context


def _template(text: str, say) -> Optional[str]:
    """A Jinja chat template to use instead of the GGUF's own; an Ollama (Go) template is not used, said once."""
    if any(marker in text for marker in ("{{ .", "{{- .", "{{.", "{{ range", "{{- range", "{{ if .", "{{- if .")):
        say("ignoring TEMPLATE: it is an Ollama (Go) template, which localrun cannot render; the model's own chat "
            "template (Jinja, from its GGUF) is used")
        return None
    from ...engine.prompt import compile_template
    from ...errors import TemplateError

    try:  # in the environment every prompt renders in: loop controls ({% break %}), {% do %}, {% generation %}
        compile_template(text)
    except TemplateError as exc:
        raise UsageError(f"TEMPLATE is not a valid Jinja chat template (line {exc.line}: {exc.reason})") from None
    return text
