"""Durability helpers shared by everything that writes a file other processes rely on."""

from __future__ import annotations

import os
from pathlib import Path


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
