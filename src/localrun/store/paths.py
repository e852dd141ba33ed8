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


def run_dir() -> Path:
    """The resident server's folder (its socket, start lock and identity), private to this user (0700). On a
    read-only LOCALRUN_HOME it is left as it is: a command that only asks the server (ps) still can, and one
    that would start a server fails when it writes there (StoreReadOnly's message, runtime.failures)."""
    return _private_folder(home() / "run")


def server_socket() -> Path:
    """The resident server's Unix socket for this LOCALRUN_HOME. A socket's path holds at most 107 bytes:
    under a deep LOCALRUN_HOME it goes in a private folder under the temporary directory instead, named
    after the home."""
    path = run_dir() / "server.sock"
    if len(os.fsencode(path)) < 100:
        return path
    import hashlib
    import tempfile

    short = Path(tempfile.gettempdir()) / f"localrun-{os.getuid()}"
    short.mkdir(mode=0o700, exist_ok=True)
    _check_private(short)
    return short / f"{hashlib.sha256(os.fsencode(home().resolve())).hexdigest()[:16]}.sock"


def _check_private(folder: Path) -> None:
    """A folder in a shared place (/tmp) must be ours alone: a real folder (not a link), owned by this user,
    mode 0700; anything else could let another user answer in the server's place."""
    import stat

    from ..errors import LocalrunError

    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise LocalrunError(f"{folder} is not a private folder of this user: remove it, or set a shorter LOCALRUN_HOME")


def logs_dir() -> Path:
    """The background server's log (it may quote prompts): private to this user, as its socket is."""
    return _private_folder(home() / "logs", chmod=False)


def _private_folder(path: Path, chmod: bool = True) -> Path:
    import stat

    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if chmod and stat.S_IMODE(path.stat().st_mode) != 0o700:
            os.chmod(path, 0o700)
    except OSError:
        if not read_only(path):
            raise
    return path


def read_only(path: Path) -> bool:
    """Whether the file system holding `path` (or its nearest existing parent) is mounted read-only."""
    st = _statvfs(path)
    return st is not None and bool(st.f_flag & os.ST_RDONLY)


def _statvfs(path: Path):
    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            return os.statvfs(candidate)
        except OSError:
            continue
    return None
