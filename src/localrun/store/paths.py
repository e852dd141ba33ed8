"""Where localrun keeps its files, and sizes as people write them."""

from __future__ import annotations

import os
import re
from pathlib import Path


def home() -> Path:
    """localrun's data folder: $LOCALRUN_HOME, else ~/.local/share/localrun."""
    explicit = os.environ.get("LOCALRUN_HOME")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "localrun"


def mirror_dir() -> Path:
    """Where GGUF files fetched from PyPI mirrors are assembled."""
    return home() / "mirror"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str, label: str) -> int:
    """'2GB', '500M', '1.5GiB', '0' -> bytes (decimal units unless 'i' is given). `label` names the
    value in the error, e.g. "--max-size '2XB'"."""
    from ..errors import UsageError

    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"invalid {label}: use a size such as 2GB, 500M or 0")
    number, unit, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    power = " kmgt".index(unit) if unit else 0
    return int(number * (1024 if binary else 1000) ** power)
