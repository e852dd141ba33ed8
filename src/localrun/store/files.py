"""Durability helpers shared by everything that writes a file other processes rely on."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Optional

from ..errors import SessionError
from .paths import _statvfs, home, read_only

CHUNK = 1 << 20
MODEL_CHUNK = 4 << 20  # bytes read at a time when a model file is hashed or copied


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable; a no-op where directories cannot be fsynced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash, or Ctrl-C) sees the old file or the whole new
    one, never a part: a temporary file beside it, fsynced, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def hash_file(path: Path | str, git: bool = False, on_chunk: Optional[Callable[[int], None]] = None,
              chunk: int = CHUNK) -> tuple[str, Optional[str]]:
    """(sha256, git blob sha1 if `git`) of a file, read once, `chunk` bytes at a time."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % Path(path).stat().st_size) if git else None
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            sha256.update(view[:n])
            if sha1 is not None:
                sha1.update(view[:n])
            if on_chunk is not None:
                on_chunk(n)
    return sha256.hexdigest(), (sha1.hexdigest() if sha1 is not None else None)


def sha256_file(path: Path | str, chunk: int = CHUNK) -> str:
    """Hex sha256 of a file."""
    return hash_file(path, chunk=chunk)[0]



def delete_files(files: Iterable[Path], keep: set[Path], stop: Path) -> list[Path]:
    """Delete each of `files` not in `keep`, and the folders that leaves empty up to (never) `stop`; returns the
    files deleted."""
    deleted: list[Path] = []
    for path in files:
        if path in keep:
            continue
        if path.exists():
            path.unlink()
            deleted.append(path)
        prune_empty_dirs(path.parent, stop)
    return deleted


def prune_empty_dirs(directory: Path, stop: Path) -> None:
    """Remove `directory` and its parents while they are empty, never `stop` itself or above."""
    stop = stop.resolve()
    current = directory.resolve()
    while current != stop and stop in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent

# -- when the disk says no ------------------------------------------------------------------------------


class StoreFull(SessionError):
    """The file system holding `path` (under LOCALRUN_HOME) has no space left: nothing stored was lost."""

    def __init__(self, path: Path):
        super().__init__(
            f"the disk holding {path} is full: free some space and try again (nothing saved before was lost)"
        )
        self.path = path


class StoreReadOnly(SessionError):
    """The file system holding `path` (LOCALRUN_HOME's, as a rule) is read-only: reading works, writing cannot."""

    def __init__(self, path: Path | str):
        where = home()
        if Path(path).is_relative_to(where):
            message = (f"LOCALRUN_HOME ({where}) is on a read-only file system, so {path} cannot be written: "
                       "remount it read-write, or set LOCALRUN_HOME to a writable folder")
        else:
            message = f"{path} is on a read-only file system: remount it read-write, or use a writable folder"
        super().__init__(message)
        self.path = path


FULL_BELOW = 64 * 1024  # free bytes under which a failed write is taken for a full disk


def disk_problem(path: Path, exc: Optional[BaseException] = None) -> Optional[SessionError]:
    """StoreFull or StoreReadOnly when `exc` (an OSError, or SQLite's error) came of a full or read-only file
    system under `path`, else None. SQLite does not always say SQLITE_FULL for a full disk (a write of its
    shared-memory or WAL file fails as a 'disk I/O error'), so the file system is asked too."""
    err = getattr(exc, "errno", None)
    name = getattr(exc, "sqlite_errorname", "") or ""
    if err == errno.ENOSPC or err == errno.EDQUOT or name.startswith("SQLITE_FULL"):
        return StoreFull(path)
    if err == errno.EROFS or read_only(path):
        return StoreReadOnly(path)
    if exc is None or err is not None or name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY")):
        st = _statvfs(path)
        if st is not None and st.f_bavail * st.f_frsize < FULL_BELOW:
            return StoreFull(path)
    return None


def store_write_error(exc: OSError, path: Path) -> BaseException:
    """What to raise for an OSError writing under `path`: StoreFull or StoreReadOnly, else `exc` itself."""
    return disk_problem(path, exc) or exc
