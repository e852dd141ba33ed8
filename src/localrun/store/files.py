"""Durability helpers shared by everything that writes a file other processes rely on."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Optional

CHUNK = 1 << 20


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
