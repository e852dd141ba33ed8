"""`localrun quantize`: another quant of a model, made here with llama.cpp's quantizer and registered like a
pulled model (`list` shows it as NAME:QUANT with source `local`)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ... import hub
from ...errors import LocalrunError, Phrase, UsageError


def base_name(filename: str) -> str:
    """A GGUF file's model name without its quant: 'SmolLM2-135M-Instruct.Q4_1.gguf' -> 'SmolLM2-135M-Instruct'."""
    stem = re.sub(r"\.gguf$", "", filename, flags=re.IGNORECASE)
    quant = hub.quant_of(filename)
    if quant:
        stem = re.sub(rf"[._-]{re.escape(quant)}$", "", stem, flags=re.IGNORECASE)
    return stem


def default_output(name: str, stem: str, quant: str) -> Path:
    from ...store.paths import home

    folder = re.sub(r"[^\w.-]+", "_", name)
    return home() / "quantized" / folder / f"{stem}.{quant}.gguf"


def quantize_model(ref: str, quant: str, *, out: Optional[Path] = None, allow_requantize: bool = False,
                   source: str = "auto", threads: Optional[int] = None,
                   on_progress: Optional[Callable[[int, int], None]] = None) -> "hub.LocalModel":
    """Write `ref` (pulled first if need be) in `quant` and register the result. Refuses, before writing
    anything, an unknown quant, a file that is not a usable GGUF, a quantized source without
    allow_requantize, an output that exists, and a disk without room for the result."""
    from ...engine.gguf_info import read_info
    from ...engine.quantize import UNQUANTIZED, check_quant, estimated_bytes, quantize
    from ...store.files import sha256_file

    quant = check_quant(quant)
    local = hub.ensure_local(ref, source=source)
    info = read_info(local.path)  # refuses a file that is not a usable GGUF
    have = (info.quant or "").upper()
    what = local.path.name if local.source == "path" else local.ref
    if have == quant:
        raise UsageError(f"{what} is already {quant}: pick another quant")
    if have not in UNQUANTIZED and not allow_requantize:
        raise UsageError(Phrase(
            "{what} is already quantized ({quant}): quantizing it again adds the new rounding to the old, "
            "so the result is worse than the same quant made from the F16/BF16 original; pass {allow_requantize} "
            "to do it anyway", what=what, quant=info.quant)
        )
    name = local.name if local.source != "path" else base_name(local.path.name)
    tag = made_tag(local, quant)
    dest = Path(out).expanduser().resolve() if out is not None else default_output(name, base_name(local.path.name), quant)
    if dest.exists():
        raise UsageError(f"{dest} already exists: remove it (`localrun rm {name}:{tag}`) or pass -o elsewhere")
    dest.parent.mkdir(parents=True, exist_ok=True)
    need, free = estimated_bytes(info.n_params, quant), shutil.disk_usage(dest.parent).free
    if need > free:
        raise LocalrunError(
            f"not enough disk space for {dest.name}: it needs about {need / 1e6:.0f} MB and {dest.parent} has "
            f"{free / 1e6:.0f} MB free: free some space or pass -o elsewhere"
        )
    try:
        quantize(local.path, dest, quant, allow_requantize=allow_requantize, threads=threads, on_progress=on_progress)
    except LocalrunError:
        if shutil.disk_usage(dest.parent).free < (1 << 20) * 64:
            raise LocalrunError(f"no space left on the disk of {dest.parent} while writing {dest.name}: free some "
                                "space or pass -o elsewhere") from None
        raise
    return hub.register_local(name, tag, dest, sha256_file(dest), origin=f"quantized from {what} ({info.quant})")


def made_tag(local, quant: str) -> str:
    """The tag a quant made here is known by: QUANT, or QUANT-local for a model `pull` fetches (an alias, a Hub
    repository), whose NAME:QUANT names the file published there (the requantized file stood in for the
    Hub's: `pull smollm2:Q4_0` answered "already pulled" with it)."""
    return f"{quant}{hub.MADE_HERE_TAG}" if local.source in ("hub", "mirror") else quant
