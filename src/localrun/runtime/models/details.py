"""Ollama's `details` of a model (/api/tags, /api/show, /api/ps), read from its GGUF metadata."""

from __future__ import annotations

from typing import Any


def model_details(info) -> dict[str, Any]:
    """Ollama's `details` of a model (/api/tags, /api/show, /api/ps) from its GGUF metadata."""
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": _parameter_size(info.n_params), "quantization_level": info.quant}


def _parameter_size(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)
