"""Write a GGUF file in another quant with llama.cpp's own quantizer (llama_model_quantize), as llama-quantize
does. The output is written to a temporary name and renamed only when complete."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ..errors import EngineError, UsageError
from .llama import default_threads, llama_cpp_module

# quant -> (llama_ftype, approximate bits per weight for the disk-space check)
QUANTS: dict[str, tuple[int, float]] = {
    "Q4_0": (2, 4.55), "Q4_1": (3, 5.0), "Q5_0": (8, 5.55), "Q5_1": (9, 6.0), "Q8_0": (7, 8.5),
    "Q2_K": (10, 3.0), "Q3_K_S": (11, 3.5), "Q3_K_M": (12, 3.9), "Q3_K_L": (13, 4.3), "Q4_K_S": (14, 4.6),
    "Q4_K_M": (15, 4.9), "Q5_K_S": (16, 5.5), "Q5_K_M": (17, 5.7), "Q6_K": (18, 6.6),
    "F16": (1, 16.0), "BF16": (32, 16.0), "F32": (0, 32.0),
}
UNQUANTIZED = ("F32", "F16", "BF16")
_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")


def check_quant(quant: str) -> str:
    q = quant.upper()
    if q not in QUANTS:
        raise UsageError(f"unknown quant {quant!r}: use one of {', '.join(QUANTS)}")
    return q


def estimated_bytes(n_params: int, quant: str) -> int:
    """About how large the output will be (the disk-space check before writing)."""
    return int(n_params * QUANTS[quant][1] / 8 * 1.02) + (1 << 20)


def quantize(source: Path, dest: Path, quant: str, *, allow_requantize: bool = False,
             threads: Optional[int] = None, on_progress: Optional[Callable[[int, int], None]] = None) -> None:
    """Quantize `source` into `dest` (written as dest + '.partial', then renamed). `on_progress(done, total)`
    hears each tensor. Raises EngineError with llama.cpp's reason when it refuses."""
    from . import llama

    ll = llama_cpp_module()
    quant = check_quant(quant)
    params = ll.llama_model_quantize_default_params()
    params.ftype = QUANTS[quant][0]
    params.allow_requantize = allow_requantize
    params.nthread = threads or default_threads()
    partial = dest.with_name(dest.name + ".partial")
    lines: list[str] = []

    def heard(text: str) -> None:
        lines.append(text)
        m = _PROGRESS.search(text)
        if m and on_progress is not None:
            on_progress(int(m.group(1)), int(m.group(2)))

    try:
        with llama.log_listener(heard), llama.deferred_interrupt():
            rc = ll.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes_ref(params))
        if rc != 0:
            reason = next((ln.split("failed to quantize:", 1)[1].strip() for ln in lines if "failed to quantize:" in ln), "")
            raise EngineError(f"llama.cpp could not quantize {source.name} to {quant}" + (f": {reason}" if reason else ""))
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)


def ctypes_ref(params):
    import ctypes

    return ctypes.byref(params)
