"""Who may write a named session: one writer at a time, across processes and threads.

A session is read, answered and written back; two writers doing that at once would each write back what they
read plus their own turn, and the last one would silently drop the other's. So a writer holds the session's
writer lock (`locks/<name>.writer`, an flock the kernel releases when the process dies, however it dies) from
before it reads the session until after it has saved it:

  * a `run --session NAME` holds it for its one turn; a second run of NAME waits for it, then reads what the
    first saved and appends its own turn (both turns land, in the order the lock was granted);
  * a chat holds it from the moment it opens (or loads, or saves) a session until it ends; any other writer of
    that session (a run, a second chat) is refused in one line naming the chat's process. A chat that finds a
    run holding the session waits for that run, which is short.

The lock file holds "<pid> <holder>" of the process holding it, so that a refusal can name it. Standard library
only: a chat kept by the background server takes these locks in the client process (runtime.client.remote).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ..errors import SessionError
from .names import check_name

CHAT, RUN = "chat", "run"
POLL_S = 0.05


class SessionInUse(SessionError):
    """Session `name` is held for writing by process `pid`, a `holder` ("chat" or "run")."""

    def __init__(self, name: str, pid: int, holder: str):
        if holder == CHAT:
            message = f"session {name!r} is open in {_other(CHAT, pid)}: end that chat first, or use another session name"
        else:
            message = f"session {name!r} is being written by {_other(RUN, pid)}: try again when it finishes"
        super().__init__(message)
        self.name, self.pid, self.holder = name, pid, holder


def _other(holder: str, pid: int) -> str:
    """Who holds a session, for a message: a process by its pid, or, where the holder is this very process (a
    server answering two requests of one session), the other request through it."""
    return f"another {holder} through the server" if pid == os.getpid() else f"another {holder} (pid {pid})"


def default_locks() -> Path:
    from .paths import home

    return home() / "sessions" / "locks"


class SessionWriter:
    """This process's hold on one session's writer lock; `release` (or the process's end) lets it go."""

    def __init__(self, name: str, path: Path, fd: int):
        self.name, self.path = name, path
        self._fd: Optional[int] = fd
        self._finalizer = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            self._fd = None
            self._finalizer()  # closing the descriptor releases the flock

    def __enter__(self) -> "SessionWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def hold_writer(name: str, holder: str, *, locks: Optional[Path] = None,
                on_wait: Optional[Callable[[str], None]] = None,
                cancelled: Optional[Callable[[], bool]] = None) -> SessionWriter:
    """Take session `name`'s writer lock as a `holder` ("run" or "chat"): waiting while a run holds it,
    refused (SessionInUse) while a chat holds it. `on_wait` hears once that it waits; `cancelled()` true
    stops the wait (SessionInUse)."""
    from .files import store_write_error

    check_name(name)  # before its name makes a lock file
    if holder not in (CHAT, RUN):
        raise ValueError(f"holder must be {CHAT!r} or {RUN!r}, got {holder!r}")
    locks = Path(locks) if locks is not None else default_locks()
    path = locks / f"{name}.writer"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise store_write_error(exc, locks) from None
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
                return SessionWriter(name, path, fd)
            pid, other = _holder(fd)
            if other == CHAT:
                raise SessionInUse(name, pid, other)
            if cancelled is not None and cancelled():
                raise SessionInUse(name, pid, other or RUN)
            if other and not told and on_wait is not None:  # (no holder yet: it is writing its name now)
                told = True
                on_wait(f"session {name} is being answered by {_other(RUN, pid)}: waiting for it")
            time.sleep(POLL_S)
    except BaseException:
        os.close(fd)
        raise


def holder_of(name: str, *, locks: Optional[Path] = None) -> Optional[tuple[int, str]]:
    """(pid, holder) of the process holding session `name`'s writer lock, or None when none does."""
    path = (Path(locks) if locks is not None else default_locks()) / f"{check_name(name)}.writer"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return _holder(fd)
        return None
    finally:
        os.close(fd)


def _holder(fd: int) -> tuple[int, str]:
    """What the lock file says of its holder: (pid, "chat" or "run"), or (0, "") while it is being written."""
    words = os.pread(fd, 64, 0).decode("ascii", "replace").split()
    if len(words) == 2 and words[0].isdigit() and words[1] in (CHAT, RUN):
        return int(words[0]), words[1]
    return 0, ""


class SessionClaims:
    """The sessions one chat holds: each one it opens, loads or saves, until the chat ends (`release_all`, or
    the process's end)."""

    def __init__(self, *, locks: Optional[Path] = None, on_wait: Optional[Callable[[str], None]] = None):
        self.locks = locks
        self.on_wait = on_wait
        self.held: dict[str, SessionWriter] = {}

    def hold(self, name: str) -> None:
        """Hold session `name` for this chat (at once when it already does); SessionInUse when another chat has it."""
        if name not in self.held:
            self.held[name] = hold_writer(name, CHAT, locks=self.locks, on_wait=self.on_wait)

    def release_all(self) -> None:
        while self.held:
            self.held.popitem()[1].release()
