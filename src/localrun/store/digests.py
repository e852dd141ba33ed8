"""Every model file's digest (its sha256, as Ollama lists a model's): computed once per file and kept in
$LOCALRUN_HOME/digests.json by path, size and mtime, so a model served by path is told apart from another
with the same name by clients that key models by digest."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Optional

from . import paths
from .files import atomic_write_bytes, hash_file

_lock = threading.Lock()
_computing: set[str] = set()


def _index() -> Path:
    return paths.home() / "digests.json"


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _read() -> dict:
    try:
        data = json.loads(_index().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_digest(path: Path | str) -> Optional[str]:
    """The file's sha256 if it was computed for the file as it is now (same size and mtime), else None."""
    path = Path(path).resolve()
    try:
        size, mtime = _stamp(path)
    except OSError:
        return None
    row = _read().get(str(path))
    if isinstance(row, dict) and row.get("size") == size and row.get("mtime_ns") == mtime:
        return row.get("sha256")
    return None


def file_digest(path: Path | str, *, wait: bool = True) -> Optional[str]:
    """The file's sha256, from the cache or computed now (`wait`), or computed in the background (None
    until it is done: a listing on the server's event loop never reads a whole GGUF)."""
    path = Path(path).resolve()
    found = cached_digest(path)
    if found is not None or not path.is_file():
        return found
    if not wait:
        with _lock:
            if str(path) in _computing:
                return None
            _computing.add(str(path))
        threading.Thread(target=_compute_idle, args=(path,), name="localrun-digest", daemon=True).start()
        return None
    return _compute(path)


def _compute_idle(path: Path) -> None:
    """_compute in a background thread that takes only CPU nothing else wants: hashing a 1.1 GB GGUF took a
    core for a second or two after a server's first listing, and the first requests' prompts, evaluated by
    llama.cpp's threads on the same cores, took twice as long meanwhile (bench_serve.py's first request)."""
    try:
        tid = threading.get_native_id()
        if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):  # Linux: this thread alone
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        elif hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    except OSError:
        pass  # not allowed here: hashed at the usual priority
    _compute(path)


def _compute(path: Path) -> Optional[str]:
    try:
        size, mtime = _stamp(path)
        digest, _ = hash_file(path)
        with _lock:
            rows = _read()
            rows[str(path)] = {"size": size, "mtime_ns": mtime, "sha256": digest}
            rows = {p: r for p, r in rows.items() if os.path.exists(p)}  # forget files that are gone
            try:
                _index().parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(_index(), json.dumps(rows, indent=1).encode())
            except OSError:
                pass  # a read-only or full home: the digest is still right, only not kept
        return digest
    except OSError:
        return None
    finally:
        with _lock:
            _computing.discard(str(path))
