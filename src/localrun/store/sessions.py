"""The KV-cache session store: named conversations and an automatic prefix cache, kept on disk.

Restoring a 2,000-token KV state takes milliseconds; evaluating those tokens again takes seconds.

Layout under the root (default `<home>/sessions`):

    index.sqlite      one row per session: what made the state (model file sha256, quant, kv type,
                      swa_full, flash attention, llama.cpp build), its tokens, messages, checksum, times;
                      one row per prefix-cache chunk (prefix_chunks) and per identity its chunks hang from
    states/<id>.kv    the llama.cpp KV state of one session, written once, never modified
    prefix/<id>.kv    one prefix-cache chunk: the KV state of PREFIX_CHUNK_TOKENS consecutive tokens
    locks/*.lock      cross-process locks: one per session name, one for the prefix cache's eviction
    locks/*.writer    a session's writer lock, held by the run or chat writing it (store/writers.py)

Two kinds of entry:
  * a session has a name, is saved and loaded on request, and is never evicted unless asked
    (`remove`, or `prune(..., named=True)`);
  * the prefix cache keeps prompts' KV in chunks keyed by the token prefix they extend (as vLLM's and
    SGLang's block hashes): a chunk of tokens a..b is keyed by a hash of the identity of what made it and of
    every token 0..b, so prompts sharing their first 18,000 tokens share those chunks and store them once,
    and a chunk made under other settings is never found. `prefix_chain` gives the chunks of a prompt's
    longest stored prefix (the runtime puts them together), `add_prefix_chunks` stores the ones a prompt
    adds. The chunks' bytes on disk are kept under $LOCALRUN_CACHE_MAX (default 2 GB): the least recently
    used chains lose their last chunks first, so the prefixes used last stay whole; `prune` evicts them
    before any session. (A model whose state cannot be cut, a recurrent one's, keeps whole states: one
    chunk of all its tokens, used only whole.)

Crash safety: a state (or chunk) goes to a temporary file that is fsynced and renamed into place, then one
SQLite transaction points the entry at it, then the previous file is deleted. A process killed at any moment
leaves the old entry or the new one, and at worst a file no entry names (a `.kv.tmp`, or a `.kv` written but
not committed). The writer holds an flock on its new file until its entry is committed, so whoever opens
the store next can tell a file still being saved (locked) from one a dead process left (unlocked) and
deletes the latter: nothing is left on disk that the index does not name, and `total_bytes` counts what is
on disk. A state file whose size or CRC-32 does not match its row is reported, and its entry removed.
Processes share the prefix cache without waiting for one another's writes: a chunk's file is written before
its row is committed and deleted after its row is, and a reader that finds a file gone checks whether its
row went too (evicted meanwhile: not damage).

Full and read-only disks: a write that fails for want of space raises StoreFull ("nothing saved before was
lost": SQLite's transaction and the rename leave every saved session whole), never "the index is damaged".
On a read-only file system the store opens read-only (listing and showing work) and a write raises
StoreReadOnly.

The store knows nothing of llama.cpp: it keeps bytes, token ids and the identity of what made them
(runtime/sessions.py takes them from the engine and gives them back, and picks the longest prefix).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import sqlite3
import sys
import time
import uuid
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Union

from filelock import FileLock, Timeout

from ..errors import SessionError, UsageError
from .files import StoreFull, StoreReadOnly, disk_problem, fsync_dir, read_only, sha256_file, store_write_error
from .names import DEFAULT_CACHE_MAX, cache_max_bytes, check_name  # noqa: F401 - part of this module's API

MIN_PREFIX_TOKENS = 64  # restoring fewer tokens than this saves too little to be worth a disk read
# Tokens per prefix-cache chunk: what two prompts that part mid-chunk both store of their shared tokens, and
# the files a long prompt takes (74 for 18,858 tokens, 7.3 MB each on Qwen2.5-1.5B). Part of every chunk's
# key: chunks of another size are never found.
PREFIX_CHUNK_TOKENS = 256
LOCK_TIMEOUT_S = 30.0
TOUCH_WAIT_MS = 200  # the LRU order is a hint: a touch waits this long for the index, then is skipped
WRITE_BATCH = 32  # chunk files written, then committed, at a time (each is held open and flocked until then)



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
    adapters: str = ""  # the LoRA adapters its state was made under (Identity.adapters); "" none

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


@migration
def m002_prefix_chunks(db: sqlite3.Connection) -> None:
    """The prefix cache in chunks shared between prompts; the whole-state prefix entries before them go (their
    files, no longer named, are deleted as abandoned when the store opens)."""
    db.execute(
        """
        CREATE TABLE prefix_roots (
            root TEXT PRIMARY KEY,            -- hash of what made the chunks (Identity): every chain starts here
            model_ref TEXT NOT NULL,
            model_file TEXT NOT NULL,
            model_sha256 TEXT NOT NULL,
            quant TEXT NOT NULL,
            n_ctx INTEGER NOT NULL,           -- the context of the last save (shown, not checked)
            kv_type TEXT NOT NULL,
            swa_full INTEGER NOT NULL,
            flash_attn TEXT NOT NULL,
            build TEXT NOT NULL,
            system_info TEXT NOT NULL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE prefix_chunks (
            key TEXT PRIMARY KEY,             -- hash of the parent's key and this chunk's tokens
            parent TEXT NOT NULL,             -- the chunk before it, or the root for tokens from 0
            root TEXT NOT NULL,
            start_pos INTEGER NOT NULL,       -- its tokens' positions: start_pos .. end_pos - 1
            end_pos INTEGER NOT NULL,
            whole INTEGER NOT NULL,           -- 1: a state that cannot be cut (a recurrent model's), used only whole
            tokens BLOB NOT NULL,             -- its own tokens, int32 little-endian
            file TEXT NOT NULL UNIQUE,        -- under prefix/
            size INTEGER NOT NULL,
            checksum TEXT NOT NULL,
            created REAL NOT NULL,
            last_used REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX prefix_chunks_parent ON prefix_chunks (parent)")
    db.execute("CREATE INDEX prefix_chunks_lru ON prefix_chunks (last_used, end_pos)")
    db.execute("DELETE FROM entries WHERE kind = 'prefix'")


@migration
def m003_adapters(db: sqlite3.Connection) -> None:
    """A session's LoRA adapters and scales (Identity.adapters): a state made under them resumes only under them.
    Sessions saved before were made without any."""
    db.execute("ALTER TABLE entries ADD COLUMN adapters TEXT NOT NULL DEFAULT ''")


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


# -- helpers -----------------------------------------------------------------------------------


INDEX = "index.sqlite"


def default_root() -> Path:
    from .paths import home

    return home() / "sessions"


def damaged_index(exc: Exception, index: Optional[Path] = None) -> SessionError:
    """The one message for an index SQLite cannot use: a damaged header (found on opening) or a damaged
    page deeper in (found by whichever query reaches it). A full or read-only disk is not a damaged index
    (moving the index aside would throw every session away): StoreFull or StoreReadOnly then."""
    index = index if index is not None else default_root() / INDEX
    problem = disk_problem(index.parent, exc)
    if problem is not None:
        return problem
    return SessionError(f"the session index {index} is unusable ({exc}): move it aside to start afresh")


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as int32 little-endian bytes (how the index keeps them)."""
    a = array("i", tokens)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def unpack_tokens(blob: bytes) -> list[int]:
    a = array("i")
    a.frombytes(blob)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()


def head_hash(tokens: Sequence[int]) -> Optional[str]:
    """What prefix entries are looked up by: a hash of their first MIN_PREFIX_TOKENS tokens."""
    if len(tokens) < MIN_PREFIX_TOKENS:
        return None
    return hashlib.sha1(pack_tokens(tokens[:MIN_PREFIX_TOKENS])).hexdigest()


def _checksum(data: bytes | bytearray | memoryview) -> str:
    # CRC-32 guards against torn and damaged files (sizes are checked too) at ~4 GB/s; sha256 would
    # cost about 5x more on every load, and the model's identity is carried by its own sha256.
    return f"crc32:{zlib.crc32(data):08x}"


class CorruptState(Exception):
    """A state file that is missing, of the wrong size, or fails its checksum."""


@dataclass(frozen=True)
class Identity:
    """What a KV state depends on: a state restores only into an engine with the same identity."""

    model_file: str
    model_sha256: str
    quant: str
    kv_type: str
    swa_full: bool
    flash_attn: str
    build: str
    system_info: str
    # The LoRA adapters the KV was made under, with their scales ("SHA256@SCALE,..." of each taking part: the
    # engine's and the request's, runtime.sessions.identity); "" for none, as a state of the model alone.
    adapters: str = ""


@dataclass(frozen=True)
class PrefixChunk:
    """One stored prefix-cache chunk: the KV of `tokens` at positions start..end-1, after its parent's."""

    key: str
    parent: str
    start: int
    end: int
    whole: bool
    tokens: list[int]
    file: str
    size: int
    checksum: str


def _chunk(row: sqlite3.Row) -> PrefixChunk:
    return PrefixChunk(row["key"], row["parent"], row["start_pos"], row["end_pos"], bool(row["whole"]),
                       unpack_tokens(row["tokens"]), row["file"], row["size"], row["checksum"])


def prefix_root(ident: Identity) -> str:
    """The key every chain of chunks made with this identity starts from: a chunk made with another model
    file, quant, KV type, swa_full, flash attention, llama.cpp build, LoRA adapters and scales or chunk size
    hashes to other keys (the model alone, with no adapters, keeps the keys it had before adapters were known)."""
    what = ["localrun prefix chunks 1", PREFIX_CHUNK_TOKENS, ident.model_sha256, ident.quant, ident.kv_type,
            bool(ident.swa_full), ident.flash_attn, ident.build]
    if ident.adapters:
        what.append(ident.adapters)
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def _chunk_key(parent: str, tokens: Sequence[int], whole: bool) -> str:
    return hashlib.blake2b(parent.encode() + (b"W" if whole else b"C") + pack_tokens(tokens), digest_size=16).hexdigest()


@dataclass
class PrefixPlan:
    """A prompt's chunks (`spans` of its tokens and their `keys`) and which of them the cache lacks."""

    root: str
    tokens: list[int]
    whole: bool
    spans: list[tuple[int, int]]
    keys: list[str]
    missing: list[int]  # indices into spans: the chunks to write
    path: list[str]  # the chunks stored already that hold its tokens (touched when it is saved)

    def parent(self, i: int) -> str:
        return self.keys[i - 1] if i else self.root


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- the store ---------------------------------------------------------------------------------


class SessionStore:
    """Sessions and prefix-cache entries under one root. Not shared across threads; open one per process
    (or thread). Processes coordinate through file locks and SQLite's own locking."""

    def __init__(self, root: Path, db: sqlite3.Connection, *, unwritable: Optional[SessionError] = None):
        self.root = root
        self.states = root / "states"
        self.prefix = root / "prefix"
        self.locks = root / "locks"
        self.db = db
        self.unwritable = unwritable  # why this store was opened for reading only (StoreReadOnly, StoreFull)

    @property
    def read_only(self) -> bool:
        return self.unwritable is not None

    @classmethod
    def open(cls, root: Path | None = None) -> "SessionStore":
        """Open (creating) the store under `root`, and delete the state files a killed save left behind.
        On a read-only file system, or a full one where SQLite cannot make its shared-memory file: opened for
        reading only (listing and showing work; a write raises StoreReadOnly or StoreFull)."""
        root = Path(root) if root is not None else default_root()
        if read_only(root):
            return cls._open_read_only(root, StoreReadOnly(root))
        try:
            for folder in (root, root / "states", root / "prefix", root / "locks"):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise store_write_error(exc, root) from None
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
            problem = damaged_index(exc, index)
            if isinstance(problem, StoreFull):
                try:
                    return cls._open_read_only(root, problem)
                except SessionError:
                    pass
            raise problem from None
        store = cls(root, db)
        store._sweep_orphans()
        return store

    @classmethod
    def _open_read_only(cls, root: Path, why: SessionError) -> "SessionStore":
        """The store for reading only, where it cannot be written (`why`). SQLite opens a WAL index read-only
        when its shared-memory and WAL files exist (a process has it open); otherwise it could only make them,
        so the index is opened immutable (nothing can write it meanwhile). No index at all: an empty store."""
        index = root / INDEX
        db = None
        try:
            if index.exists():
                for mode in ("mode=ro", "immutable=1"):
                    db = sqlite3.connect(f"{index.resolve().as_uri()}?{mode}", uri=True, isolation_level=None)
                    try:
                        applied = {row[0] for row in db.execute("SELECT name FROM _migrations")}
                        break
                    except sqlite3.OperationalError:
                        db.close()
                        if mode == "immutable=1":
                            raise
                if any(name not in applied for name, _ in MIGRATIONS):
                    raise why  # an older index, which this version would migrate first
            else:
                db = sqlite3.connect(":memory:", isolation_level=None)
                migrate(db)
        except sqlite3.DatabaseError as exc:
            raise damaged_index(exc, index) from None
        db.row_factory = sqlite3.Row
        return cls(root, db, unwritable=why)

    def _writable(self) -> None:
        if self.unwritable is not None:
            raise self.unwritable

    def writer(self, name: str, holder: str, *, on_wait=None, cancelled=None):
        """Session `name`'s writer lock (store/writers.py), to hold while reading, answering and saving it."""
        from .writers import hold_writer

        self._writable()
        return hold_writer(name, holder, locks=self.locks, on_wait=on_wait, cancelled=cancelled)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- named sessions ------------------------------------------------------------------------

    def save(self, name: str, ident: Identity, tokens: Sequence[int], messages: list[dict], state: Callable[[], bytearray],
             *, model_ref: str, n_ctx: int) -> SessionInfo:
        """Save a KV state holding `tokens` (`state` makes its bytes, under the session's lock) and `messages`
        as session `name`, replacing any session of that name. Atomic: a crash leaves the previous save or
        this one."""
        check_name(name)
        self._writable()
        blob = pack_tokens(tokens)
        text = json.dumps(messages, ensure_ascii=False)
        with self._locked(name, f"session {name!r}"):
            data = state()
            with self._new_state(data) as (state_file, checksum):
                now = time.time()
                with self._transaction():
                    old = self.db.execute("SELECT state_file, created FROM entries WHERE name = ?", (name,)).fetchone()
                    if old is not None:
                        self.db.execute("DELETE FROM entries WHERE name = ?", (name,))
                    self._insert(name, "session", model_ref, ident, n_ctx, tokens, blob, text, state_file, len(data),
                                 checksum, created=old["created"] if old else now, now=now)
            if old is not None:
                self._unlink(old["state_file"])
            return self.show(name)

    def load(self, name: str, ident: Identity, n_ctx: int, restore: Callable[[bytearray, list[int]], bool],
             held: Optional[Callable[[list[int]], bool]] = None,
             on_notice: Optional[Callable[[str], None]] = None) -> list[dict]:
        """Hand session `name`'s state and tokens to `restore` (under the session's lock) and return its
        messages. Refused, with the reason, when the state was made by another model file, quant, kv type,
        swa_full, flash attention setting or llama.cpp build, or holds more tokens than `n_ctx`. A damaged
        state (a cache of what its messages compute) is removed and said to `on_notice`: the messages, which are
        the user's, are returned without it, evaluated again by the next answer, whose save replaces the entry.
        `held(tokens)` true: the caller still holds that state (a resident model that saved it), so nothing is read."""
        check_name(name)  # before its name makes a lock file
        with self._locked(name, f"session {name!r}"):
            row = self._usable_row(name, ident, n_ctx)
            tokens = unpack_tokens(row["tokens"])
            if (held is not None and held(tokens)) or not tokens:  # (no tokens: its state was removed, as said then)
                self._touch(row["id"])
                return json.loads(row["messages"])
            try:
                data = self._read_state(row)
            except CorruptState as exc:
                self._unlink(row["state_file"])
                if not self.read_only:  # the entry holds no state from now on: the next load says nothing again
                    with self._transaction():
                        self.db.execute("UPDATE entries SET n_tokens = 0, tokens = ?, head_hash = ?, state_size = 0 WHERE id = ?",
                                        (pack_tokens([]), head_hash([]), row["id"]))
                messages = json.loads(row["messages"])
                if on_notice is not None:
                    on_notice(f"session {name!r}: its saved KV cache was damaged ({exc}) and is removed; its "
                              f"{len(messages)} messages are evaluated again")
                return messages
            if not restore(data, tokens):
                raise SessionError(
                    f"llama.cpp could not restore session {name!r} into this context: "
                    f"load the model as it was saved (context {row['n_ctx']}, KV cache type {row['kv_type']}, flash attention {row['flash_attn']})"
                )
            self._touch(row["id"])
            return json.loads(row["messages"])

    def list(self, *, prefixes: bool = False) -> list[SessionInfo]:
        """Named sessions (and the prefix cache's chains too when `prefixes`: prefix_chains), most recently used
        first."""
        rows = self.db.execute("SELECT * FROM entries WHERE kind = 'session' ORDER BY last_used DESC, id DESC").fetchall()
        found = [_info(row) for row in rows]
        if prefixes:
            found = sorted(found + self.prefix_chains(), key=lambda e: e.last_used, reverse=True)
        return found

    def messages(self, name: str, ident: Identity, n_ctx: int) -> list[dict]:
        """Session `name`'s messages, without its state; refused as `load` refuses (SessionError, also when
        there is none)."""
        return json.loads(self._usable_row(name, ident, n_ctx)["messages"])

    def _usable_row(self, name: str, ident: Identity, n_ctx: int) -> sqlite3.Row:
        """Session `name`'s row when its state can go into an engine of this identity and context."""
        row = self._row(name)
        reason = _mismatch(row, ident, n_ctx)
        if isinstance(reason, Mismatch):
            raise SessionMismatch(f"session {name!r} {reason.reason}", reason.setting, reason.saved)
        if reason:
            raise SessionError(f"session {name!r} {reason}")
        return row

    def _row(self, name: str) -> sqlite3.Row:
        check_name(name)
        row = self.db.execute("SELECT * FROM entries WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise SessionError(f"no session named {name!r}: see `localrun sessions list`")
        return row

    def show(self, name: str) -> SessionInfo:
        return _info(self._row(name))

    def remove(self, name: str) -> SessionInfo:
        """Delete session `name`: after a run writing it has saved; refused while a chat holds it (it would
        save it again after its next answer)."""
        from .writers import RUN

        check_name(name)
        with self.writer(name, RUN), self._locked(name, f"session {name!r}"):
            row = self.db.execute("SELECT * FROM entries WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise SessionError(f"no session named {name!r}: see `localrun sessions list`")
            self._delete_rows([row])
        return _info(row)

    def total_bytes(self, kind: Optional[str] = None) -> int:
        """Bytes the state and chunk files take on disk (every file under states/ and prefix/, named by the
        index or still being saved); `kind` ("session" or "prefix"): what the index records for the sessions,
        or for the prefix cache's chunks (each counted once, however many prompts share it)."""
        if kind is None:
            total = 0
            for path in self._state_dir_entries():
                try:
                    total += path.stat().st_size
                except FileNotFoundError:
                    pass
            return total
        if kind == "prefix":
            return self.db.execute("SELECT COALESCE(SUM(size), 0) FROM prefix_chunks").fetchone()[0]
        return self.db.execute("SELECT COALESCE(SUM(state_size), 0) FROM entries WHERE kind = ?", (kind,)).fetchone()[0]

    def prune(self, max_bytes: int, *, named: bool = False) -> list[SessionInfo]:
        """Evict least-recently-used entries until all states together take at most `max_bytes`.
        The prefix cache's chunks go first (prefix chains, from their ends); named sessions only when `named`
        is True (one that another process holds is skipped). Also deletes state files no entry refers to that
        no save is writing. Returns what was removed: the chains that lost their last chunk, then sessions."""
        if max_bytes < 0:
            raise UsageError(f"invalid size {max_bytes}: use 0 or more bytes")
        self._writable()
        self._sweep_orphans()
        with self._locked(".prefix-cache", "the prefix cache"):
            chains = self._prefix_chains()
            outside = self.total_bytes() - self.total_bytes("prefix")  # sessions' files and any still being saved
            gone = self._evict_prefixes(max(0, max_bytes - outside))
            removed = sorted((c for key, c in chains if key in gone), key=lambda c: (c.last_used, -c.tokens))
            total = self.total_bytes()
            if total <= max_bytes or not named:
                return removed
            for row in self.db.execute("SELECT * FROM entries ORDER BY kind = 'session', last_used, id").fetchall():
                if total <= max_bytes:
                    break
                if row["kind"] == "session" and not self._remove_if_free(row):
                    continue
                if row["kind"] != "session":  # (a whole-state prefix entry an older localrun added since)
                    self._delete_rows([row])
                total -= row["state_size"]
                removed.append(_info(row))
        return removed

    # -- the prefix cache ----------------------------------------------------------------------

    def prefix_plan(self, root: str, tokens: Sequence[int], whole: bool = False) -> PrefixPlan:
        """The chunks of `tokens` (PREFIX_CHUNK_TOKENS each from position 0, the last maybe shorter; `whole`:
        one of them all) and which of them the cache lacks. A last chunk that a longer one beside it holds
        whole (the same tokens, then more) is not lacking. Read without a lock: a save checks again."""
        tokens = list(tokens)
        n, size = len(tokens), PREFIX_CHUNK_TOKENS
        spans = [(0, n)] if whole else [(a, min(a + size, n)) for a in range(0, n, size)]
        keys, parent = [], root
        for a, b in spans:
            parent = _chunk_key(parent, tokens[a:b], whole)
            keys.append(parent)
        stored = self._stored_keys(keys)
        missing = [i for i, key in enumerate(keys) if key not in stored]
        path = [key for key in keys if key in stored]
        if not whole and missing == [len(keys) - 1]:
            a, b = spans[-1]
            for row in self.db.execute("SELECT key, tokens FROM prefix_chunks WHERE parent = ? AND whole = 0",
                                       (keys[-2] if len(keys) > 1 else root,)):
                held = unpack_tokens(row["tokens"])
                if len(held) > b - a and held[: b - a] == tokens[a:b]:
                    missing, path = [], path + [row["key"]]
                    break
        return PrefixPlan(root, tokens, whole, spans, keys, missing, path)

    def prefix_chain(self, root: str, tokens: Sequence[int], limit: int) -> list[tuple[PrefixChunk, int]]:
        """The chunks holding the longest stored prefix of `tokens[:limit]`, in order, each with how many of its
        tokens belong to it (all, but for the last, which may be cut where the prompt parts from it; a whole
        state only whole). Read without a lock: a chunk evicted meanwhile is missing when read."""
        tokens = list(tokens[:limit])
        size = PREFIX_CHUNK_TOKENS
        keys, parent = [], root
        for a in range(0, len(tokens) - size + 1, size):
            parent = _chunk_key(parent, tokens[a : a + size], False)
            keys.append(parent)
        stored = self._stored_keys(keys)
        run = 0
        while run < len(keys) and keys[run] in stored:
            run += 1
        chain: list[tuple[PrefixChunk, int]] = []
        if run:
            rows = {row["key"]: _chunk(row) for row in self._rows_of(keys[:run])}
            for key in keys[:run]:
                chunk = rows.get(key)
                if chunk is None or chunk.tokens != tokens[chunk.start : chunk.end]:
                    break  # (evicted since, or a hash that lied)
                chain.append((chunk, chunk.end - chunk.start))
        at = chain[-1][0].end if chain else 0
        best, best_n = None, 0
        for row in self.db.execute("SELECT * FROM prefix_chunks WHERE parent = ?", (chain[-1][0].key if chain else root,)):
            chunk = _chunk(row)
            n = _shared(chunk.tokens, tokens[at:])
            if chunk.whole and (at or n < len(chunk.tokens)):
                continue  # a whole state holds only all its tokens
            if n > best_n:
                best, best_n = chunk, n
        if best is not None:
            chain.append((best, best_n))
        return chain

    def read_chunk(self, chunk: PrefixChunk) -> bytearray:
        """A chunk's bytes; CorruptState when its file is missing, torn or damaged (chunk_stored says whether it
        was evicted meanwhile instead)."""
        return self._read_file(self.prefix / chunk.file, chunk.size, chunk.checksum, "chunk file")

    def chunk_stored(self, chunk: PrefixChunk) -> bool:
        return bool(self._stored_keys([chunk.key]))

    def drop_chunks(self, chunks: Sequence[PrefixChunk]) -> None:
        """Remove these chunks (found damaged) and the chunks after them, which nothing reaches any more."""
        self._writable()
        with self._transaction():
            for chunk in chunks:
                self.db.execute("DELETE FROM prefix_chunks WHERE key = ?", (chunk.key,))
            files = [chunk.file for chunk in chunks] + list(self._drop_unreachable().values())
        for name in files:
            self._unlink_chunk(name)

    def touch_chunks(self, keys: Sequence[str]) -> None:
        """Mark these chunks used now (a chain: its first chunks are then never older than its last). Only the
        LRU order rides on this: skipped when the index is busy for long, and not fsynced."""
        if self.read_only or not keys:
            return
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(f"PRAGMA busy_timeout={TOUCH_WAIT_MS}")
        try:
            with self._transaction():
                self._mark_used(keys, self._now())
        except SessionError:
            pass  # the index was busy: the order stays as it was
        finally:
            self.db.execute(f"PRAGMA busy_timeout={int(LOCK_TIMEOUT_S * 1000)}")
            self.db.execute("PRAGMA synchronous=FULL")

    def add_prefix_chunks(self, ident: Identity, plan: PrefixPlan, pieces: dict[int, bytes | bytearray], *,
                          model_ref: str, n_ctx: int, cap: int) -> Optional[SessionInfo]:
        """Store the chunks `plan` lacks (`pieces`: their bytes, by index into plan.spans), as many as fit under
        `cap` with the chunks before them, then evict least recently used chunks down to `cap`. The chunks it
        passes through are marked used; a shorter last chunk beside its new last one (the same tokens, fewer)
        is replaced. Returns the chain it ends (prefix_chains' entry), or None when nothing was stored.

        The files are written and fsynced before the index is touched, without any lock: a reader or another
        save never waits for them. Each stays flocked until its row is committed (see _sweep_orphans)."""
        self._writable()
        if cap <= 0:
            self._evict_prefixes(0)
            return None
        stored = sum(row["size"] for row in self._rows_of(plan.path))
        writing = []
        for i in sorted(pieces):  # the chain's first chunks first: a chunk after one that is not stored is unreachable
            if i not in plan.missing or stored + len(pieces[i]) > cap:
                break
            writing.append(i)
            stored += len(pieces[i])
        if not writing:
            self.touch_chunks(plan.path)
            self._evict_prefixes(cap)
            return None
        used, stored_to = list(plan.path), len(writing)
        for at in range(0, len(writing), WRITE_BATCH):  # a batch's files stay open (flocked) until they are committed
            batch, unused, replaced = writing[at : at + WRITE_BATCH], [], []
            with self._new_files(self.prefix, [pieces[i] for i in batch]) as files:
                with self._transaction():
                    now = self._now()
                    self.db.execute(
                        "INSERT OR REPLACE INTO prefix_roots VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (plan.root, model_ref, ident.model_file, ident.model_sha256, ident.quant, n_ctx, ident.kv_type,
                         int(ident.swa_full), ident.flash_attn, ident.build, ident.system_info),
                    )
                    for n, (i, (name, checksum)) in enumerate(zip(batch, files)):
                        parent, key = plan.parent(i), plan.keys[i]
                        if parent != plan.root and not self._stored_keys([parent]):
                            unused += [name for name, _ in files[n:]]  # evicted meanwhile: nothing after it is reachable
                            stored_to = at + n
                            break
                        a, b = plan.spans[i]
                        cur = self.db.execute(
                            "INSERT OR IGNORE INTO prefix_chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (key, parent, plan.root, a, b, int(plan.whole), pack_tokens(plan.tokens[a:b]), name,
                             len(pieces[i]), checksum, now, now),
                        )
                        if not cur.rowcount:
                            unused.append(name)  # another save stored it meanwhile
                        used.append(key)
                        for row in self.db.execute("SELECT * FROM prefix_chunks WHERE parent = ? AND key != ?", (parent, key)):
                            held = unpack_tokens(row["tokens"])
                            if len(held) < b - a and held == plan.tokens[a : a + len(held)] and bool(row["whole"]) == plan.whole:
                                replaced.append(row["file"])  # the same tokens, fewer: this chunk holds them all
                                self.db.execute("DELETE FROM prefix_chunks WHERE key = ?", (row["key"],))
                    self._mark_used(used, now)
                    replaced += list(self._drop_unreachable().values())
            for name in unused + replaced:
                self._unlink_chunk(name)
            if stored_to < len(writing):
                break
        self._evict_prefixes(cap)
        if not stored_to:
            return None
        end = plan.keys[writing[stored_to - 1]]
        return next((info for key, info in self._prefix_chains() if key == end), None)

    def prefix_chains(self) -> list[SessionInfo]:
        """The prefix cache as entries: one per chain of chunks that ends (no chunk after its last), most
        recently used first. Its tokens are those of its whole chain; its size is what its chunks take that
        no chain used after it shares (the sizes add up to the cache's bytes on disk)."""
        return [info for _, info in self._prefix_chains()]

    def _prefix_chains(self) -> list[tuple[str, SessionInfo]]:
        rows = {row["key"]: row for row in self.db.execute(
            "SELECT c.*, r.model_ref, r.model_file, r.model_sha256, r.quant, r.n_ctx, r.kv_type, r.swa_full,"
            " r.flash_attn, r.build FROM prefix_chunks c LEFT JOIN prefix_roots r ON c.root = r.root")}
        parents = {row["parent"] for row in rows.values()}
        ends = sorted((row for key, row in rows.items() if key not in parents),
                      key=lambda row: (row["last_used"], row["end_pos"]), reverse=True)
        counted: set[str] = set()
        chains = []
        for end in ends:
            size, key = 0, end["key"]
            while key in rows and key not in counted:
                counted.add(key)
                size += rows[key]["size"]
                key = rows[key]["parent"]
            chains.append((end["key"], SessionInfo(
                name=None, kind="prefix", model=end["model_ref"] or "", model_file=end["model_file"] or "",
                model_sha256=end["model_sha256"] or "", quant=end["quant"] or "", n_ctx=end["n_ctx"] or 0,
                kv_type=end["kv_type"] or "", swa_full=bool(end["swa_full"]), flash_attn=end["flash_attn"] or "",
                build=end["build"] or "", tokens=end["end_pos"], size=size, checksum=end["checksum"],
                created=end["created"], last_used=end["last_used"],
            )))
        return chains

    def trim_prefixes(self, cap: int) -> None:
        """Evict least-recently-used prefix chunks until they use at most `cap` bytes."""
        self._writable()
        self._evict_prefixes(cap)

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _locked(self, key: str, what: str) -> Iterator[None]:
        if self.read_only:  # nothing can change a read-only store: nothing to wait for (nor a lock file to make)
            yield
            return
        lock = FileLock(self.locks / f"{key}.lock", timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise SessionError(
                f"{what} is in use by another localrun process (waited {LOCK_TIMEOUT_S:.0f} s): try again when it finishes"
            ) from None
        except OSError as exc:
            raise store_write_error(exc, self.locks) from None
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise disk_problem(self.root, exc) or SessionError(f"the session index is busy ({exc}): try again") from None
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException as exc:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            problem = disk_problem(self.root, exc) if isinstance(exc, (sqlite3.Error, OSError)) else None
            if problem is not None:
                raise problem from None
            raise

    def model_sha256(self, shards: Sequence[Path]) -> str:
        """sha256 of a model file (of its shards' hashes, for a split model), cached by path, size and mtime."""
        digests = [self._file_sha256(Path(p)) for p in shards]
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(digests).encode()).hexdigest()

    def known_sha256(self, path: Path) -> Optional[str]:
        """The sha256 of a model file hashed here before (unchanged since), without hashing it: None if not."""
        try:
            path = path.resolve()
            st = path.stat()
        except OSError:
            return None
        row = self.db.execute("SELECT size, mtime_ns, sha256 FROM file_hashes WHERE path = ?", (str(path),)).fetchone()
        return row["sha256"] if row is not None and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns else None

    def _file_sha256(self, path: Path) -> str:
        path = path.resolve()
        st = path.stat()
        row = self.db.execute("SELECT size, mtime_ns, sha256 FROM file_hashes WHERE path = ?", (str(path),)).fetchone()
        if row is not None and row["size"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns:
            return row["sha256"]
        digest = sha256_file(path)
        if self.read_only:
            return digest
        with self._transaction():
            self.db.execute(
                "INSERT OR REPLACE INTO file_hashes (path, size, mtime_ns, sha256) VALUES (?, ?, ?, ?)",
                (str(path), st.st_size, st.st_mtime_ns, digest),
            )
        return digest

    def _insert(self, name, kind, model_ref, ident: Identity, n_ctx, tokens, blob, messages, state_file, size, checksum, *,
                created, now) -> int:
        cur = self.db.execute(
            """
            INSERT INTO entries (name, kind, model_ref, model_file, model_sha256, quant, n_ctx, kv_type, swa_full,
                flash_attn, build, system_info, n_tokens, tokens, head_hash, messages, state_file, state_size,
                checksum, created, last_used, adapters)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            (
                name, kind, model_ref, ident.model_file, ident.model_sha256, ident.quant, n_ctx, ident.kv_type,
                int(ident.swa_full), ident.flash_attn, ident.build, ident.system_info, len(tokens), blob,
                head_hash(tokens), messages, state_file, size, checksum, created, now, ident.adapters,
            ),
        )
        return cur.lastrowid

    def _touch(self, entry_id: int) -> None:
        # Only the LRU order rides on this: losing it to a power cut is harmless, so skip the fsync.
        if self.read_only:
            return
        self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._transaction():
                self.db.execute("UPDATE entries SET last_used = ? WHERE id = ?", (time.time(), entry_id))
        finally:
            self.db.execute("PRAGMA synchronous=FULL")

    def _create_locked(self, folder: Path) -> tuple[str, int]:
        """A new file `<name>.tmp` in `folder`, open for writing and flocked: (name, descriptor)."""
        while True:
            name = f"{uuid.uuid4().hex}.kv"
            tmp = folder / f"{name}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise store_write_error(exc, folder) from None
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                    return name, fd
            except FileNotFoundError:
                pass
            os.close(fd)  # swept between its creation and the lock (it looked abandoned): take another name

    @contextmanager
    def _new_state(self, data: bytearray) -> Iterator[tuple[str, str]]:
        """Write a new state file (temp name, fsync, rename, fsync the folder) and yield (file name, checksum)
        while its entry is committed; the file is deleted if that fails. It stays flocked until then, so
        that `_sweep_orphans` in another process leaves it alone."""
        with self._new_files(self.states, [data]) as files:
            yield files[0]

    @contextmanager
    def _new_files(self, folder: Path, datas: Sequence) -> Iterator[list[tuple[str, str]]]:
        """Write new files in `folder`, one per buffer of `datas` (each to a temp name, fsynced, renamed; the
        folder fsynced once), and yield their (file name, checksum) while their rows are committed; they are
        deleted if that fails. They stay flocked until then (see _sweep_orphans)."""
        made: list[tuple[str, int]] = []
        try:
            try:
                for data in datas:
                    name, fd = self._create_locked(folder)
                    made.append((name, fd))
                    with open(fd, "wb", buffering=0, closefd=False) as f:
                        view = memoryview(data)
                        while view:
                            view = view[f.write(view):]
                        os.fsync(fd)
                    os.replace(folder / f"{name}.tmp", folder / name)
                fsync_dir(folder)
            except BaseException as exc:
                for name, _ in made:
                    self._unlink_in(folder, f"{name}.tmp")
                    self._unlink_in(folder, name)  # (renamed already)
                if isinstance(exc, OSError):
                    raise store_write_error(exc, folder) from None
                raise
            try:
                yield [(name, _checksum(data)) for (name, _), data in zip(made, datas)]
            except BaseException:
                for name, _ in made:
                    self._unlink_in(folder, name)
                raise
        finally:
            for _, fd in made:
                os.close(fd)

    def _read_state(self, row: sqlite3.Row) -> bytearray:
        return self._read_file(self.states / row["state_file"], row["state_size"], row["checksum"])

    def _read_file(self, path: Path, size: int, checksum: str, what: str = "state file") -> bytearray:
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
                view.release()
        except FileNotFoundError:
            raise CorruptState(f"its {what} {path.name} is missing") from None
        if got < size:
            raise CorruptState(f"the {what} is truncated: {got} of {size} bytes")
        if extra:
            raise CorruptState(f"the {what} is longer than the {size} bytes recorded")
        found = _checksum(data)
        if found != checksum:
            raise CorruptState(f"the {what} fails its checksum: {found}, expected {checksum}")
        return data

    def _delete_rows(self, rows: Sequence[sqlite3.Row]) -> None:
        with self._transaction():
            for row in rows:
                self.db.execute("DELETE FROM entries WHERE id = ?", (row["id"],))
        for row in rows:
            self._unlink(row["state_file"])

    def _remove_if_free(self, row: sqlite3.Row) -> bool:
        from .writers import holder_of

        if holder_of(row["name"], locks=self.locks) is not None:
            return False  # a run or chat is writing it
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

    # -- the prefix cache's index ----------------------------------------------------------------

    def _stored_keys(self, keys: Sequence[str]) -> set[str]:
        return {row["key"] for row in self._rows_of(keys, "key")}

    def _rows_of(self, keys: Sequence[str], columns: str = "*") -> list[sqlite3.Row]:
        rows = []
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            rows += self.db.execute(f"SELECT {columns} FROM prefix_chunks WHERE key IN ({marks})", part).fetchall()
        return rows

    def _now(self) -> float:
        """Now, never before a time already recorded (a chain touched after another is never older)."""
        (latest,) = self.db.execute("SELECT COALESCE(MAX(last_used), 0) FROM prefix_chunks").fetchone()
        return max(time.time(), latest)

    def _mark_used(self, keys: Sequence[str], now: float) -> None:
        for i in range(0, len(keys), 500):
            part = list(keys[i : i + 500])
            marks = ",".join("?" * len(part))
            self.db.execute(f"UPDATE prefix_chunks SET last_used = ? WHERE key IN ({marks})", [now, *part])

    def _drop_unreachable(self) -> dict[str, str]:
        """Delete the chunks whose parent is gone (inside a transaction): {key: file name}, the files to delete
        once it is committed."""
        gone = {}
        while True:
            rows = self.db.execute(
                "SELECT key, file FROM prefix_chunks c WHERE c.parent != c.root"
                " AND NOT EXISTS (SELECT 1 FROM prefix_chunks p WHERE p.key = c.parent)").fetchall()
            if not rows:
                return gone
            for row in rows:
                self.db.execute("DELETE FROM prefix_chunks WHERE key = ?", (row["key"],))
                gone[row["key"]] = row["file"]

    def _evict_prefixes(self, cap: int) -> set[str]:
        """Evict least-recently-used prefix chunks until they total at most `cap` bytes: the chains used least
        recently lose their last chunks first (a chain's first chunks are never older than its last, being
        marked used with it). Returns the keys of the chunks removed."""
        if self.read_only:
            return set()
        over = self.db.execute("SELECT COALESCE(SUM(size), 0) > ? FROM prefix_chunks", (cap,)).fetchone()[0]
        legacy = self.db.execute("SELECT 1 FROM entries WHERE kind = 'prefix' LIMIT 1").fetchone()
        if not over and legacy is None:
            return set()
        gone: dict[str, str] = {}
        with self._transaction():
            old = self.db.execute("SELECT state_file FROM entries WHERE kind = 'prefix'").fetchall()
            self.db.execute("DELETE FROM entries WHERE kind = 'prefix'")  # whole states an older localrun stored
            (total,) = self.db.execute("SELECT COALESCE(SUM(size), 0) FROM prefix_chunks").fetchone()
            for row in self.db.execute("SELECT key, file, size FROM prefix_chunks ORDER BY last_used, end_pos DESC").fetchall():
                if total <= cap:
                    break
                self.db.execute("DELETE FROM prefix_chunks WHERE key = ?", (row["key"],))
                gone[row["key"]] = row["file"]
                total -= row["size"]
            if gone:
                gone.update(self._drop_unreachable())
        for row in old:
            self._unlink(row["state_file"])
        for name in gone.values():
            self._unlink_chunk(name)
        return set(gone)

    def _state_dir_entries(self) -> list[Path]:
        """The state and chunk files on disk, and those being written."""
        found = []
        for folder in (self.states, self.prefix):
            try:
                found += [p for p in folder.iterdir() if p.name.endswith((".kv", ".kv.tmp"))]
            except FileNotFoundError:
                pass
        return found

    def _sweep_orphans(self) -> None:
        """Delete state and chunk files no entry refers to that no save is writing: left by a process killed
        between write and commit (a `.kv.tmp`, or a `.kv` not yet named by the index), or between commit and
        delete. A save holds an flock on its file until its entry is committed: a file this takes the lock of is
        abandoned, once the index (read again under the lock) does not name it."""
        if self.read_only:
            return
        for folder, named in ((self.states, "SELECT 1 FROM entries WHERE state_file = ?"),
                              (self.prefix, "SELECT 1 FROM prefix_chunks WHERE file = ?")):
            table, column = ("entries", "state_file") if folder == self.states else ("prefix_chunks", "file")
            known = {row[0] for row in self.db.execute(f"SELECT {column} FROM {table}")}
            try:
                paths = [p for p in folder.iterdir() if p.name.endswith((".kv", ".kv.tmp"))]
            except FileNotFoundError:
                continue
            for path in paths:
                if path.name in known:
                    continue
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError as exc:
                        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                            continue  # a save is writing it, or committing it right now
                        raise
                    if self.db.execute(named, (path.name,)).fetchone():
                        continue  # committed since `known` was read
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        path.unlink()
                except FileNotFoundError:
                    pass
                except OSError:
                    return  # (a file system that will not delete: it stays, counted by total_bytes)
                finally:
                    os.close(fd)

    def _unlink(self, file_name: str) -> None:
        self._unlink_in(self.states, file_name)

    def _unlink_chunk(self, file_name: str) -> None:
        self._unlink_in(self.prefix, file_name)

    @staticmethod
    def _unlink_in(folder: Path, file_name: str) -> None:
        try:
            (folder / file_name).unlink()
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class Mismatch:
    """A session saved with another value of a load setting than this engine's: the value that resumes it."""

    reason: str
    setting: str
    saved: object


class SessionMismatch(SessionError):
    """A session that resumes only with its `setting` at the `saved` value (the edge says how to give it)."""

    def __init__(self, message: str, setting: str, saved: object):
        super().__init__(message)
        self.setting, self.saved = setting, saved


def _mismatch(row: sqlite3.Row, ident: Identity, n_ctx: int) -> Union[str, Mismatch, None]:
    """Why a stored state cannot be restored into an engine of this identity and context (completing 'session NAME ...'), or None."""
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
        return Mismatch(f"was saved with KV cache type {row['kv_type']}, not {ident.kv_type}", "kv_type", row["kv_type"])
    if bool(row["swa_full"]) != ident.swa_full:
        return (
            f"was saved with swa_full={bool(row['swa_full'])} (full sliding-window cache), "
            f"this engine has swa_full={ident.swa_full}: load the model as it was saved"
        )
    if row["flash_attn"] != ident.flash_attn:
        return f"was saved with flash attention {row['flash_attn']}, not {ident.flash_attn}: load the model as it was saved"
    if (row["adapters"] or "") != ident.adapters:
        return adapters_mismatch(row["adapters"] or "", ident.adapters)
    if row["build"] != ident.build:
        return f"was saved by {row['build']}, this is {ident.build}: KV states do not carry across llama.cpp builds, start a new session"
    if row["n_tokens"] >= n_ctx:
        return Mismatch(f"holds {row['n_tokens']} tokens but the context holds {n_ctx}", "ctx", row["n_ctx"])
    return None


def adapters_mismatch(saved: str, now: str) -> str:
    """Why a state made under the LoRA adapters `saved` (Identity.adapters) is not resumed under `now` (completing
    'session NAME ...')."""
    return (f"was saved {_adapters_said(saved)}, not {_adapters_said(now)}: its KV holds what they computed; resume it "
            "with the adapters and scales it was saved with")


def _adapters_said(adapters: str) -> str:
    """'without LoRA adapters', or 'with LoRA adapters 1a2b3c4d5e6f at 0.5, ...' (each file's sha256, shortened)."""
    if not adapters:
        return "without LoRA adapters"
    parts = [part.partition("@") for part in adapters.split(",")]
    return "with LoRA adapter" + ("s " if len(parts) > 1 else " ") + ", ".join(f"{sha[:12]} at {scale}" for sha, _, scale in parts)


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
        adapters=row["adapters"] if "adapters" in row.keys() else "",
    )
