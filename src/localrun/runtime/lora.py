"""LoRA adapters as the layers above see them: the ones a model was loaded with, the scales a request is answered
under, and the model's default scales changed while it stays loaded (llama-server's /lora-adapters and per-request
`lora`). The adapters themselves are loaded with the model (runtime.loader: LoadSpec.lora and a Modelfile's
ADAPTER lines, checked against the model before it loads); a request only picks scales, so it never reloads.

What an HTTP handler calls (each raises LoraRequestError, a SettingError of the setting "lora", for a request
it cannot honour):

    listed(loaded)                      -> [{"id", "path", "scale", "task_name", "prompt_prefix"}]
                                                                       GET /lora-adapters, /api/show
    request_scales(loaded, entries)     -> scales for Request.lora     a request's `lora: [{"id", "scale"}]`
    set_default_scales(loaded, entries) -> listed(loaded)              POST /lora-adapters
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engine.lora import AdapterError, check_adapter, parse_adapter, read_adapter
from ..errors import SettingError

__all__ = ["AdapterError", "LoraRequestError", "check_adapters", "check_scales", "listed", "parse_adapters",
           "request_scales", "set_default_scales"]


class LoraRequestError(SettingError):
    """A request's LoRA scales that cannot be used: `value` as given, `reason` why (an id the model has no adapter
    for, a scale that is no number, not a list of {"id", "scale"})."""

    def __init__(self, value: Any, reason: str):
        super().__init__("lora", value, reason)


def parse_adapters(values: Sequence[str], base_dir: "Path | None" = None) -> tuple[tuple[str, float], ...]:
    """--lora FILE[:SCALE] values (repeatable) as (absolute path, scale) pairs, each file checked to be a LoRA
    adapter's GGUF (AdapterError names it): before any model is resolved, pulled or loaded."""
    adapters = tuple(parse_adapter(value, base_dir) for value in values)
    for path, _ in adapters:
        read_adapter(path)
    return adapters


def check_adapters(adapters: Sequence[tuple[str, float]], model_path: "Path | str") -> None:
    """Refuse, before the model loads, an adapter made for another architecture or base model than the file at
    `model_path` (AdapterError naming both)."""
    for path, _ in adapters:
        check_adapter(read_adapter(path), model_path)


def listed(loaded) -> list[dict[str, Any]]:
    """The adapters a loaded model has, as llama-server's GET /lora-adapters lists them: id (the index a request's
    `lora` names), path, the scale a request that names none is answered under, and the adapter's own task name and
    prompt prefix (its GGUF's adapter.lora.task_name and prompt_prefix; "" where it has none)."""
    engine = loaded.engine
    out = []
    for i, (path, _) in enumerate(engine.options.lora):
        try:
            made = read_adapter(path)
            task, prefix = made.task_name, made.prompt_prefix
        except AdapterError:  # (gone since it loaded: llama.cpp holds its tensors still)
            task, prefix = "", ""
        out.append({"id": i, "path": path, "scale": engine.lora_defaults[i], "task_name": task, "prompt_prefix": prefix})
    return out


def request_scales(loaded, entries: Any) -> tuple[float, ...]:
    """A request's `lora` (llama-server's per-request list of {"id", "scale"}) as the scales Request.lora takes:
    one per adapter the model was loaded with, 0 for each the list does not name (as llama-server does). An empty
    list asks for nothing: the model's own scales."""
    engine = loaded.engine
    if isinstance(entries, list) and not entries:
        return tuple(engine.lora_defaults)
    return _scales(engine, entries)


def set_default_scales(loaded, entries: Any) -> list[dict[str, Any]]:
    """POST /lora-adapters: the scales every later request that names none is answered under (those the list does not
    name become 0, as llama-server sets them), while the model stays loaded. Answers in progress keep theirs; the KV
    kept under the former scales is not reused under these (engine.kv keys it by them). Returns `listed(loaded)`."""
    engine = loaded.engine
    engine.lora_defaults = _scales(engine, entries)
    return listed(loaded)


def check_scales(engine, scales: Any) -> tuple[float, ...]:
    """Request.lora checked against the model: a number per adapter it was loaded with, each finite."""
    values = tuple(scales) if isinstance(scales, (list, tuple)) else None
    if values is None or len(values) != len(engine.adapters):
        raise LoraRequestError(scales, _count(engine))
    return tuple(_scale(scales, value) for value in values)


def _scales(engine, entries: Any) -> tuple[float, ...]:
    n = len(engine.adapters)
    if not isinstance(entries, list):
        raise LoraRequestError(entries, 'give a list of {"id": N, "scale": X}')
    if not n:
        raise LoraRequestError(entries, _count(engine))
    scales = [0.0] * n
    for entry in entries:
        if not isinstance(entry, dict) or "id" not in entry:
            raise LoraRequestError(entries, 'each entry is {"id": N, "scale": X}')
        index = entry["id"]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise LoraRequestError(entries, f"no adapter has id {index!r}: {_count(engine)}")
        scales[index] = _scale(entries, entry.get("scale", 0.0))
    return tuple(scales)


def _scale(given: Any, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LoraRequestError(given, f"the scale {value!r} is not a finite number")
    return float(value)


def _count(engine) -> str:
    n = len(engine.adapters)
    if not n:  # (no flag: the setting at fault is named by the edge, --lora on the command line, lora over HTTP)
        return "this model was loaded without LoRA adapters: load it with some, or make a model with a Modelfile's ADAPTER"
    return f"this model has {n} LoRA adapter{'s' if n > 1 else ''} (ids 0..{n - 1})"
