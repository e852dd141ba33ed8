"""What a command checks before it loads anything, without the session store's imports (sqlite3,
filelock): a session's name and the prefix cache's size cap. `run` on a warm background server needs
only these."""

from __future__ import annotations

import os
import re

from ..errors import UsageError

DEFAULT_CACHE_MAX = 2_000_000_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def cache_max_bytes() -> int:
    """$LOCALRUN_CACHE_MAX: bytes the prefix cache may use ("2GB", "500M", "1.5GiB", "0" to disable)."""
    from .paths import parse_size

    raw = os.environ.get("LOCALRUN_CACHE_MAX", "")
    if not raw.strip():
        return DEFAULT_CACHE_MAX
    return parse_size(raw, f"LOCALRUN_CACHE_MAX={raw!r} (0 disables the prefix cache)")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(
            f"invalid session name {name!r}: use up to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name
