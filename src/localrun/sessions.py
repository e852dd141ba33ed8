"""The KV-cache session store: named conversations and an automatic prefix cache, kept on disk.

Restoring a 2,000-token KV state takes milliseconds; evaluating those tokens again takes seconds.

Layout under the root (default `<home>/sessions`):

    index.sqlite      one row per entry: what made the state (model file sha256, quant, kv type,
                      swa_full, flash attention, llama.cpp build), its tokens, messages, checksum, times
    states/<id>.kv    the llama.cpp KV state of one entry, written once, never modified
    locks/*.lock      cross-process locks: one per session name, one for the prefix cache

Two kinds of entry:
  * a session has a name, is saved and loaded on request, and is never evicted unless asked
    (`remove`, or `prune(..., named=True)`);
  * a prefix entry has no name; `save_prefix` stores what the engine holds, `lookup_prefix` restores
    the longest stored prefix of a new prompt. They are evicted least-recently-used first, to keep
    their total under $LOCALRUN_CACHE_MAX (default 2 GB), and before any session in `prune`.

Crash safety: a state goes to a temporary file that is fsynced and renamed into place, then one SQLite
transaction points the entry at it, then the previous file is deleted. A process killed at any moment
leaves the old entry or the new one, and at worst an unreferenced file that `prune` sweeps once it is
old. A state file whose size or CRC-32 does not match its row is reported, and its entry removed.

Which state is saved: llama.cpp's per-sequence state (seq_id 0) keeps only the last window of a
sliding-window model's SWA layers, so a restored gemma-3 state could be extended but not cut back to a
shorter common prefix without silently wrong output. The engine decodes into one sequence, so the
state of all sequences (seq_id -1) is seq 0's, with its full sliding-window history (swa_full=True
keeps that history in memory). Contexts with more than one sequence are refused.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import sqlite3
import time
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from filelock import FileLock, Timeout

from .errors import EngineError, SessionError, UsageError
from .files import fsync_dir

if TYPE_CHECKING:
    import numpy as np

    from .engine import Engine

MIN_PREFIX_TOKENS = 64  # restoring fewer tokens than this saves too little to be worth a disk read
DEFAULT_CACHE_MAX = 2_000_000_000
LOCK_TIMEOUT_S = 30.0
ORPHAN_AGE_S = 600.0  # an unreferenced state file younger than this may be a save about to commit
ALL_SEQUENCES = -1

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


# -- what the store reports ------------------------------------------------------------------


@dataclass(frozen=True)
class SessionInfo:
    """One stored entry: a named session, or (name None, kind "prefix") a prefix-cache entry."""

    name: Optional[str]
    kind: str  # "session" or "prefix"
    model: str  # the reference it was saved under (alias, repo, or file name)
    model_file: str
    model_sha256: str
    quant: str
    n_ctx: int
    kv_type: str
    swa_full: bool
    flash_attn: str  # "auto", "on" or "off", as asked when the engine was loaded
    build: str
    tokens: int
    size: int  # bytes of the state file
    checksum: str
    created: float  # seconds since the epoch
    last_used: float
    messages: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


# -- migrations (append only: never edit or reorder one that has shipped) ---------------------

MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = []


def migration(fn: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE entries (
            id INTEGER PRIMARY KEY,
            name TEXT UNIQUE,                 -- NULL for a prefix-cache entry
            kind TEXT NOT NULL CHECK (kind IN ('session', 'prefix')),
            model_ref TEXT NOT NULL,
            model_file TEXT NOT NULL,
            model_sha256 TEXT NOT NULL,
            quant TEXT NOT NULL,
            n_ctx INTEGER NOT NULL,
            kv_type TEXT NOT NULL,
            swa_full INTEGER NOT NULL,
            flash_attn TEXT NOT NULL,
            build TEXT NOT NULL,
            system_info TEXT NOT NULL,
            n_tokens INTEGER NOT NULL,
            tokens BLOB NOT NULL,             -- int32 little-endian
            head_hash TEXT,                   -- of the first MIN_PREFIX_TOKENS tokens, when there are that many
            messages TEXT NOT NULL,           -- JSON list
            state_file TEXT NOT NULL,         -- under states/
            state_size INTEGER NOT NULL,
            checksum TEXT NOT NULL,           -- "crc32:xxxxxxxx"
            created REAL NOT NULL,
            last_used REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX entries_prefix ON entries (kind, model_sha256, head_hash)")
    db.execute("CREATE INDEX entries_lru ON entries (kind, last_used)")
    db.execute(
        """
        CREATE TABLE file_hashes (
            path TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            sha256 TEXT NOT NULL
        )
        """
    )


def migrate(db: sqlite3.Connection) -> None:
    """Apply the migrations this database lacks, in order, in one transaction (safe with concurrent openers)."""
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    applied = {row[0] for row in db.execute("SELECT name FROM _migrations")}
    if all(name in applied for name, _ in MIGRATIONS):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        applied = {row[0] for row in db.execute("SELECT name FROM _migrations")}
        for name, fn in MIGRATIONS:
            if name not in applied:
                fn(db)
                db.execute("INSERT INTO _migrations (name, applied) VALUES (?, ?)", (name, time.time()))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


# -- engine state <-> bytes (candidates for Engine methods) -----------------------------------


def state_bytes(engine: "Engine") -> bytearray:
    """The engine's KV state (its one sequence, with the full sliding-window history) as bytes."""
    from .engine import llama_cpp_module

    _check_single_sequence(engine)
    ll = llama_cpp_module()
    size = ll.llama_state_seq_get_size(engine.ctx, ALL_SEQUENCES)
    data = bytearray(size)
    written = ll.llama_state_seq_get_data(engine.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, ALL_SEQUENCES)
    if written != size:
        raise EngineError(f"llama.cpp wrote {written} of {size} bytes of KV state: the state was not saved")
    return data


def restore_state(engine: "Engine", data: bytearray, tokens: Sequence[int]) -> bool:
    """Replace the engine's KV cache with `data` (from state_bytes) holding `tokens`. On failure the cache
    is left empty and False is returned."""
    from .engine import llama_cpp_module

    _check_single_sequence(engine)
    ll = llama_cpp_module()
    engine.reset()
    if not data:
        return False
    read = ll.llama_state_seq_set_data(engine.ctx, (ctypes.c_uint8 * len(data)).from_buffer(data), len(data), ALL_SEQUENCES)
    # The cells must be exactly positions 0..len(tokens)-1, or engine.cached would lie about the cache.
    if read == 0 or ll.llama_memory_seq_pos_max(engine.memory, 0) != len(tokens) - 1:
        engine.reset()
        return False
    engine.cached = list(tokens)
    return True


def _check_single_sequence(engine: "Engine") -> None:
    if engine.options.n_seq_max != 1:
        raise SessionError(
            f"sessions need a single-sequence context; this one has {engine.options.n_seq_max} sequences"
        )


# -- helpers -----------------------------------------------------------------------------------


INDEX = "index.sqlite"


def default_root() -> Path:
    from .config import home

    return home() / "sessions"


def damaged_index(exc: Exception, index: Optional[Path] = None) -> SessionError:
    """The one message for an index SQLite cannot read: a damaged header (found on opening) or a damaged
    page deeper in (found by whichever query reaches it)."""
    index = index if index is not None else default_root() / INDEX
    return SessionError(f"the session index {index} is unusable ({exc}): move it aside to start afresh")


def cache_max_bytes() -> int:
    """$LOCALRUN_CACHE_MAX: bytes the prefix cache may use ("2GB", "500M", "1.5GiB", "0" to disable)."""
    from .config import parse_size

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


def _np():
    import numpy

    return numpy


def _token_array(tokens: Sequence[int]) -> "np.ndarray":
    return _np().asarray(tokens, dtype="<i4")


def _common_prefix(a: "np.ndarray", b: "np.ndarray") -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = _np().flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _head_hash(tokens: "np.ndarray") -> Optional[str]:
    if len(tokens) < MIN_PREFIX_TOKENS:
        return None
    return hashlib.sha1(tokens[:MIN_PREFIX_TOKENS].tobytes()).hexdigest()


def _checksum(data: bytes | bytearray | memoryview) -> str:
    # CRC-32 guards against torn and damaged files (sizes are checked too) at ~4 GB/s; sha256 would
    # cost about 5x more on every load, and the model's identity is carried by its own sha256.
    return f"crc32:{zlib.crc32(data):08x}"


def _has_sliding_window(engine: "Engine") -> bool:
    if not engine.info.sliding_window:
        return False
    return any(engine.info.swa_layers) if engine.info.swa_layers else True  # layout unknown: assume it has


class _Corrupt(Exception):
    """A state file that is missing, of the wrong size, or fails its checksum."""


@dataclass(frozen=True)
class _Identity:
    """What a KV state depends on: a state restores only into an engine with the same identity."""

    model_file: str
    model_sha256: str
    quant: str
    kv_type: str
    swa_full: bool
    flash_attn: str
    build: str
    system_info: str


_identities: "weakref.WeakKeyDictionary[Engine, _Identity]" = weakref.WeakKeyDictionary()


# -- the store ---------------------------------------------------------------------------------


class SessionStore:
    """Sessions and prefix-cache entries under one root. Not shared across threads; open one per process
    (or thread). Processes coordinate through file locks and SQLite's own locking."""

    def __init__(self, root: Path, db: sqlite3.Connection):
        self.root = root
        self.states = root / "states"
        self.locks = root / "locks"
        self.db = db

    @classmethod
    def open(cls, root: Path | None = None) -> "SessionStore":
        root = Path(root) if root is not None else default_root()
        for folder in (root, root / "states", root / "locks"):
            folder.mkdir(parents=True, exist_ok=True)
        index = root / INDEX
        try:
            db = sqlite3.connect(index, timeout=LOCK_TIMEOUT_S, isolation_level=None)
            db.row_factory = sqlite3.Row
            # Switching a new index to WAL takes an exclusive lock that SQLite does not wait for (the busy
            # timeout does not apply): two processes opening a fresh store at once retry here.
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                        db.execute("PRAGMA journal_mode=WAL")
                    db.execute("PRAGMA synchronous=FULL")
                    migrate(db)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        except sqlite3.DatabaseError as exc:
            raise damaged_index(exc, index) from None
        return cls(root, db)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- named sessions ------------------------------------------------------------------------

    def save(self, name: str, engine: "Engine", messages: list[dict], *, model_ref: str) -> SessionInfo:
        """Save the engine's KV cache (the tokens in engine.cached) and `messages` as session `name`,
        replacing any session of that name. Atomic: a crash leaves the previous save or this one."""
        check_name(name)
        ident = self._identity(engine)
        tokens = _token_array(engine.cached)
        text = json.dumps(messages, ensure_ascii=False)
        with self._locked(name, f"session {name!r}"):
            data = state_bytes(engine)
            state_file, checksum = self._write_state(data)
            now = time.time()
            try:
                with self._transaction():
                    old = self.db.execute("SELECT state_file, created FROM entries WHERE name = ?", (name,)).fetchone()
                    if old is not None:
                        self.db.execute("DELETE FROM entries WHERE name = ?", (name,))
                    self._insert(name, "session", model_ref, ident, engine.n_ctx, tokens, text, state_file, len(data),
                                 checksum, created=old["created"] if old else now, now=now)
            except BaseException:
                self._unlink(state_file)
                raise
            if old is not None:
                self._unlink(old["state_file"])
            return self.show(name)

    def load(self, name: str, engine: "Engine") -> list[dict]:
        """Restore session `name` into the engine (replacing its KV cache) and return its messages.

        The next engine.generate() evaluates only the tokens after the restored ones. Refused, with the
        reason, when the state was made by another model file, quant, kv type, swa_full, flash attention
        setting or llama.cpp build, or holds more tokens than the context. A damaged state is removed."""
        check_name(name)
        ident = self._identity(engine)
        with self._locked(name, f"session {name!r}"):
            row = self.db.execute("SELECT * FROM entries WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise SessionError(f"no session named {name!r}: see `localrun sessions list`")
            reason = _mismatch(row, ident, engine)
            if reason:
                raise SessionError(f"session {name!r} {reason}")
            try:
                data = self._read_state(row)
            except _Corrupt as exc:
                self._delete_rows([row])
                raise SessionError(f"session {name!r} was corrupt ({exc}) and has been removed") from None
            tokens = _np().frombuffer(row["tokens"], dtype="<i4").tolist()
            if not restore_state(engine, data, tokens):
                raise SessionError(
                    f"llama.cpp could not restore session {name!r} into this context: "
                    f"load the model as it was saved (--ctx {row['n_ctx']}, --kv-type {row['kv_type']}, flash attention {row['flash_attn']})"
                )
            self._touch(row["id"])
            return json.loads(row["messages"])

    def list(self, *, prefixes: bool = False) -> list[SessionInfo]:
        """Named sessions (and prefix entries too when `prefixes`), most recently used first."""
        where = "" if prefixes else "WHERE kind = 'session'"
        rows = self.db.execute(f"SELECT * FROM entries {where} ORDER BY last_used DESC, id DESC").fetchall()
        return [_info(row) for row in rows]

    def show(self, name: str) -> SessionInfo:
        check_name(name)
        row = self.db.execute("SELECT * FROM entries WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise SessionError(f"no session named {name!r}: see `localrun sessions list`")
        return _info(row)

    def remove(self, name: str) -> SessionInfo:
        check_name(name)
        with self._locked(name, f"session {name!r}"):
            row = self.db.execute("SELECT * FROM entries WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise SessionError(f"no session named {name!r}: see `localrun sessions list`")
            self._delete_rows([row])
        return _info(row)

    def total_bytes(self, kind: Optional[str] = None) -> int:
        if kind is None:
            return self.db.execute("SELECT COALESCE(SUM(state_size), 0) FROM entries").fetchone()[0]
        return self.db.execute("SELECT COALESCE(SUM(state_size), 0) FROM entries WHERE kind = ?", (kind,)).fetchone()[0]

    def prune(self, max_bytes: int, *, named: bool = False) -> list[SessionInfo]:
        """Evict least-recently-used entries until all states together take at most `max_bytes`.
        Prefix entries go first; named sessions only when `named` is True (one that another process
        holds is skipped). Also deletes state files no entry refers to, once they are ORPHAN_AGE_S old.
        Returns what was removed."""
        if max_bytes < 0:
            raise UsageError(f"invalid size {max_bytes}: use 0 or more bytes")
        self._sweep_orphans()
        removed: list[SessionInfo] = []
        with self._locked(".prefix-cache", "the prefix cache"):
            total = self.total_bytes()
            rows = self.db.execute(
                "SELECT * FROM entries ORDER BY kind = 'session', last_used, id"
            ).fetchall()
            for row in rows:
                if total <= max_bytes:
                    break
                if row["kind"] == "session":
                    if not named:
                        break
                    if not self._remove_if_free(row):
                        continue
                else:
                    self._delete_rows([row])
                total -= row["state_size"]
                removed.append(_info(row))
        return removed

    # -- the prefix cache ----------------------------------------------------------------------

    def lookup_prefix(self, engine: "Engine", tokens: Sequence[int], *, on_notice: Optional[Callable[[str], None]] = None) -> int:
        """Restore the stored state sharing the longest prefix with `tokens` (same model and settings) into
        the engine, when that prefix is at least MIN_PREFIX_TOKENS long and longer than what the engine
        already holds of `tokens`. Returns how many leading tokens of `tokens` the engine now holds (0: nothing
        restored, the engine untouched). A damaged entry is removed and reported through `on_notice`."""
        if len(tokens) < MIN_PREFIX_TOKENS or not _prefix_cache_applies(engine) or cache_max_bytes() <= 0:
            return 0  # LOCALRUN_CACHE_MAX=0 turns the cache off: no lookups either
        want = _token_array(tokens)
        # The engine re-evaluates a prompt's last token whatever it holds, so that one never counts.
        have = min(_common_prefix(_token_array(engine.cached), want), len(tokens) - 1)
        ident = self._identity(engine)
        with self._locked(".prefix-cache", "the prefix cache"):
            best, best_len = None, 0
            for row in self._prefix_rows(ident, _head_hash(want)):
                if row["n_tokens"] >= engine.n_ctx:
                    continue
                n = _common_prefix(_np().frombuffer(row["tokens"], dtype="<i4"), want)
                if n > best_len:
                    best, best_len = row, n
            if best is None or best_len < MIN_PREFIX_TOKENS or min(best_len, len(tokens) - 1) <= have:
                return 0
            try:
                data = self._read_state(best)
            except _Corrupt as exc:
                self._delete_rows([best])
                if on_notice:
                    on_notice(f"a prefix-cache entry was corrupt ({exc}) and has been removed")
                return 0
            if not restore_state(engine, data, _np().frombuffer(best["tokens"], dtype="<i4").tolist()):
                self._delete_rows([best])
                if on_notice:
                    on_notice("llama.cpp could not restore a prefix-cache entry; it has been removed")
                return 0
            self._touch(best["id"])
        return best_len

    def save_prefix(self, engine: "Engine") -> Optional[SessionInfo]:
        """Store the engine's KV cache as a prefix entry, unless it is shorter than MIN_PREFIX_TOKENS or an
        entry already covers it; entries it extends are replaced. Keeps the prefix cache under
        $LOCALRUN_CACHE_MAX by evicting least-recently-used entries. Returns the new entry, or None."""
        cap = cache_max_bytes()
        if cap <= 0:
            self.trim_prefixes(0)  # off means off: entries stored under a larger cap go too
            return None
        if len(engine.cached) < MIN_PREFIX_TOKENS or not _prefix_cache_applies(engine):
            return None
        ident = self._identity(engine)
        tokens = _token_array(engine.cached)
        with self._locked(".prefix-cache", "the prefix cache"):
            superseded = []
            for row in self._prefix_rows(ident, _head_hash(tokens)):
                n = _common_prefix(_np().frombuffer(row["tokens"], dtype="<i4"), tokens)
                if n == len(tokens):
                    self._touch(row["id"])  # already stored, maybe with more after it
                    return None
                if n == row["n_tokens"]:
                    superseded.append(row)
            data = state_bytes(engine)
            if len(data) > cap:  # this one can never fit; the cap still holds for what is stored
                self._evict_prefixes(cap)
                return None
            state_file, checksum = self._write_state(data)
            now = time.time()
            try:
                with self._transaction():
                    for row in superseded:
                        self.db.execute("DELETE FROM entries WHERE id = ?", (row["id"],))
                    new_id = self._insert(None, "prefix", engine.path.name, ident, engine.n_ctx, tokens, "[]",
                                          state_file, len(data), checksum, created=now, now=now)
            except BaseException:
                self._unlink(state_file)
                raise
            for row in superseded:
                self._unlink(row["state_file"])
            self._evict_prefixes(cap)
            row = self.db.execute("SELECT * FROM entries WHERE id = ?", (new_id,)).fetchone()
        self._sweep_orphans()
        return _info(row) if row is not None else None

    def trim_prefixes(self, cap: int) -> None:
        """Evict least-recently-used prefix entries until they use at most `cap` bytes."""
        with self._locked(".prefix-cache", "the prefix cache"):
            self._evict_prefixes(cap)

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _locked(self, key: str, what: str) -> Iterator[None]:
        lock = FileLock(self.locks / f"{key}.lock", timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise SessionError(
                f"{what} is in use by another localrun process (waited {LOCK_TIMEOUT_S:.0f} s): try again when it finishes"
            ) from None
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise SessionError(f"the session index is busy ({exc}): try again") from None
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _identity(self, engine: "Engine") -> _Identity:
        ident = _identities.get(engine)
        if ident is None:
            from .engine import build_id, llama_cpp_module

            flash = {None: "auto", True: "on", False: "off"}[engine.options.flash_attn]
            ident = _Identity(
                model_file=engine.path.name,
                model_sha256=self._model_sha256(engine),
                quant=engine.info.quant,
                kv_type=engine.options.kv_type,
                swa_full=bool(engine.options.swa_full),
                flash_attn=flash,
                build=build_id(),
                system_info=llama_cpp_module().llama_print_system_info().decode("utf-8", "replace").strip(),
            )
            _identities[engine] = ident
        return ident

    def _model_sha256(self, engine: "Engine") -> str:
        """sha256 of the model file (of its shards' hashes, for a split model), cached by path, size and mtime."""
        shards = list(engine.info.shards) or [engine.path]
        digests = [self._file_sha256(Path(p)) for p in shards]
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(digests).encode()).hexdigest()

    def _file_sha256(self, path: Path) -> str:
        from .gguf_info import sha256_file

        path = path.resolve()
        st = path.stat()
        row = self.db.execute("SELECT size, mtime_ns, sha256 FROM file_hashes WHERE path = ?", (str(path),)).fetchone()
        if row is not None and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns:
            return row["sha256"]
        digest = sha256_file(path)
        with self._transaction():
            self.db.execute(
                "INSERT OR REPLACE INTO file_hashes (path, size, mtime_ns, sha256) VALUES (?, ?, ?, ?)",
                (str(path), st.st_size, st.st_mtime_ns, digest),
            )
        return digest

    def _insert(self, name, kind, model_ref, ident: _Identity, n_ctx, tokens, messages, state_file, size, checksum, *, created, now) -> int:
        cur = self.db.execute(
            """
            INSERT INTO entries (name, kind, model_ref, model_file, model_sha256, quant, n_ctx, kv_type, swa_full,
                flash_attn, build, system_info, n_tokens, tokens, head_hash, messages, state_file, state_size,
                checksum, created, last_used)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            (
                name, kind, model_ref, ident.model_file, ident.model_sha256, ident.quant, n_ctx, ident.kv_type,
                int(ident.swa_full), ident.flash_attn, ident.build, ident.system_info, len(tokens), tokens.tobytes(),
                _head_hash(tokens), messages, state_file, size, checksum, created, now,
            ),
        )
        return cur.lastrowid

    def _prefix_rows(self, ident: _Identity, head: Optional[str]) -> list[sqlite3.Row]:
        if head is None:
            return []
        return self.db.execute(
            """
            SELECT * FROM entries
            WHERE kind = 'prefix' AND model_sha256 = ? AND head_hash = ? AND quant = ? AND kv_type = ?
                AND swa_full = ? AND flash_attn = ? AND build = ?
            """,
            (ident.model_sha256, head, ident.quant, ident.kv_type, int(ident.swa_full), ident.flash_attn, ident.build),
        ).fetchall()

    def _touch(self, entry_id: int) -> None:
        # Only the LRU order rides on this: losing it to a power cut is harmless, so skip the fsync.
        self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._transaction():
                self.db.execute("UPDATE entries SET last_used = ? WHERE id = ?", (time.time(), entry_id))
        finally:
            self.db.execute("PRAGMA synchronous=FULL")

    def _write_state(self, data: bytearray) -> tuple[str, str]:
        """Write a new state file (temp name, fsync, rename, fsync the folder). Returns (file name, checksum)."""
        name = f"{uuid.uuid4().hex}.kv"
        tmp = self.states / f"{name}.tmp"
        try:
            with open(tmp, "wb", buffering=0) as f:
                view = memoryview(data)
                while view:
                    view = view[f.write(view):]
                os.fsync(f.fileno())
            os.replace(tmp, self.states / name)
            fsync_dir(self.states)
        except BaseException:
            self._unlink(tmp.name)
            raise
        return name, _checksum(data)

    def _read_state(self, row: sqlite3.Row) -> bytearray:
        path = self.states / row["state_file"]
        size = row["state_size"]
        data = bytearray(size)
        try:
            with open(path, "rb", buffering=0) as f:
                view, got = memoryview(data), 0
                while got < size:
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n
                extra = f.read(1)
        except FileNotFoundError:
            raise _Corrupt(f"its state file {path.name} is missing") from None
        if got < size:
            raise _Corrupt(f"the state file is truncated: {got} of {size} bytes")
        if extra:
            raise _Corrupt(f"the state file is longer than the {size} bytes recorded")
        checksum = _checksum(data)
        if checksum != row["checksum"]:
            raise _Corrupt(f"the state file fails its checksum: {checksum}, expected {row['checksum']}")
        return data

    def _delete_rows(self, rows: Sequence[sqlite3.Row]) -> None:
        with self._transaction():
            for row in rows:
                self.db.execute("DELETE FROM entries WHERE id = ?", (row["id"],))
        for row in rows:
            self._unlink(row["state_file"])

    def _remove_if_free(self, row: sqlite3.Row) -> bool:
        lock = FileLock(self.locks / f"{row['name']}.lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return False
        try:
            current = self.db.execute("SELECT * FROM entries WHERE id = ?", (row["id"],)).fetchone()
            if current is not None:
                self._delete_rows([current])
            return True
        finally:
            lock.release()

    def _evict_prefixes(self, cap: int) -> None:
        """Evict least-recently-used prefix entries until they total at most `cap` bytes (prefix lock held)."""
        total = self.total_bytes("prefix")
        if total <= cap:
            return
        victims = []
        for row in self.db.execute("SELECT * FROM entries WHERE kind = 'prefix' ORDER BY last_used, id"):
            if total <= cap:
                break
            victims.append(row)
            total -= row["state_size"]
        self._delete_rows(victims)

    def _sweep_orphans(self, min_age_s: float = ORPHAN_AGE_S) -> None:
        """Delete state files no entry refers to (left by a crash between write and commit, or commit and delete)."""
        known = {row[0] for row in self.db.execute("SELECT state_file FROM entries")}
        cutoff = time.time() - min_age_s
        for path in self.states.iterdir():
            if path.name in known:
                continue
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except FileNotFoundError:
                pass

    def _unlink(self, file_name: str) -> None:
        try:
            (self.states / file_name).unlink()
        except FileNotFoundError:
            pass


def _prefix_cache_applies(engine: "Engine") -> bool:
    # Without swa_full a sliding-window model keeps only the last window: a stored state could not be cut
    # back to a shorter common prefix, which is what prefix reuse does.
    if engine.options.n_seq_max != 1:
        return False
    return engine.options.swa_full or not _has_sliding_window(engine)


def _mismatch(row: sqlite3.Row, ident: _Identity, engine: "Engine") -> Optional[str]:
    """Why a stored state cannot be restored into this engine (completing 'session NAME ...'), or None."""
    if row["model_sha256"] != ident.model_sha256:
        if row["model_file"] == ident.model_file:
            return (
                f"was saved with a different copy of {row['model_file']} (sha256 {row['model_sha256'][:12]}, "
                f"this one is {ident.model_sha256[:12]}): resume it with the file that made it"
            )
        return (
            f"was saved with {row['model_file']} ({row['quant']}), not {ident.model_file} ({ident.quant}): "
            f"resume it with {row['model_ref']}"
        )
    if row["kv_type"] != ident.kv_type:
        return f"was saved with --kv-type {row['kv_type']}, not {ident.kv_type}: resume it with --kv-type {row['kv_type']}"
    if bool(row["swa_full"]) != ident.swa_full:
        return (
            f"was saved with swa_full={bool(row['swa_full'])} (full sliding-window cache), "
            f"this engine has swa_full={ident.swa_full}: load the model as it was saved"
        )
    if row["flash_attn"] != ident.flash_attn:
        return f"was saved with flash attention {row['flash_attn']}, not {ident.flash_attn}: load the model as it was saved"
    if row["build"] != ident.build:
        return f"was saved by {row['build']}, this is {ident.build}: KV states do not carry across llama.cpp builds, start a new session"
    if row["n_tokens"] >= engine.n_ctx:
        return f"holds {row['n_tokens']} tokens but the context holds {engine.n_ctx}: resume it with --ctx {row['n_ctx']}"
    return None


def _info(row: sqlite3.Row) -> SessionInfo:
    return SessionInfo(
        name=row["name"],
        kind=row["kind"],
        model=row["model_ref"],
        model_file=row["model_file"],
        model_sha256=row["model_sha256"],
        quant=row["quant"],
        n_ctx=row["n_ctx"],
        kv_type=row["kv_type"],
        swa_full=bool(row["swa_full"]),
        flash_attn=row["flash_attn"],
        build=row["build"],
        tokens=row["n_tokens"],
        size=row["state_size"],
        checksum=row["checksum"],
        created=row["created"],
        last_used=row["last_used"],
        messages=json.loads(row["messages"]),
    )
