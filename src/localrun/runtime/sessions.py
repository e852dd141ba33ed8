"""Named sessions and the prefix cache for a loaded engine: the store keeps bytes, tokens and identities on
disk; this takes them from the engine's KV cache and gives them back, cuts a prompt's state into the prefix
cache's chunks and puts the chunks of its longest stored prefix back together (engine.kv: StateLayout,
cut_state, StateJoiner; common_prefix, the one prefix comparison).

Saving a prompt's chunks is done in two parts: while the request still holds its seat, only what must be read
from there (which chunks the cache lacks, from the index; the seat's KV state, from llama.cpp, when some are
missing); once the seat is given back, the rest (cutting the state, writing, fsyncing, evicting). In a server
that rest runs on a thread of its own (PrefixWriter), so that the request is over when its answer is."""

from __future__ import annotations

import atexit
import collections
import sqlite3
import threading
import weakref
from dataclasses import dataclass, replace
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..engine import Engine
from ..engine.kv import StateJoiner, StateLayout, common_prefix, cut_state
from ..engine.llama import build_id, build_system_info
from ..errors import SessionError
from ..store.sessions import (
    MIN_PREFIX_TOKENS, CorruptState, Identity, PrefixPlan, SessionInfo, SessionStore, cache_max_bytes, prefix_root,
)
from ..store.writers import RUN

_identities: "weakref.WeakKeyDictionary[Engine, Identity]" = weakref.WeakKeyDictionary()


def identity(store: SessionStore, engine: Engine, lora: Optional[Sequence[float]] = None) -> Identity:
    """What a state made by this engine depends on (the model file's sha256 is cached by the store), under the
    LoRA scales `lora` (one per adapter the engine loaded; None: those it applies now): each adapter taking part
    by its file's sha256 and its scale, so that a state made under other adapters or scales, or none, is another
    identity (a prefix-cache chain of its own, a session refused)."""
    ident = _base_identity(store, engine)
    scales = engine.lora if lora is None else tuple(lora)
    if not any(scales):
        return ident
    return replace(ident, adapters=adapters_key(store, [(path, scale) for (path, _), scale in zip(engine.options.lora, scales)]))


def adapters_key(store: SessionStore, adapters: Sequence[tuple[str, float]]) -> str:
    """Identity.adapters of KV made under these (file, scale) adapters: each taking part (a scale not 0) by its file's
    sha256 (cached by the store) and its scale; "" for none."""
    return ",".join(f"{store.model_sha256([Path(path)])}@{float(scale)!r}" for path, scale in adapters if scale != 0)


def seat_lora(seat) -> Optional[tuple[float, ...]]:
    """The LoRA scales a seat's KV is made under (a server slot's request's; None: the engine's own now)."""
    return getattr(seat, "lora", None)


def _base_identity(store: SessionStore, engine: Engine) -> Identity:
    ident = _identities.get(engine)
    if ident is None:
        flash = {None: "auto", True: "on", False: "off"}[engine.options.flash_attn]
        ident = Identity(
            model_file=engine.path.name,
            model_sha256=store.model_sha256(list(engine.info.shards) or [engine.path]),
            quant=engine.info.quant,
            kv_type=engine.options.kv_type,
            swa_full=bool(engine.options.swa_full),
            flash_attn=flash,
            build=build_id(),
            system_info=build_system_info(),
        )
        _identities[engine] = ident
    return ident


def _cache_identity(store: SessionStore, engine: Engine, lora: Optional[Sequence[float]] = None) -> Optional[Identity]:
    """identity(), or None when the model's file is gone (`localrun rm` while it answered): there is nothing
    to key its cache by, and nothing will ask for it again. Said nowhere: the user removed it."""
    try:
        return identity(store, engine, lora)
    except FileNotFoundError:
        if all(Path(p).exists() for p in [*(list(engine.info.shards) or [engine.path]), *(a for a, _ in engine.options.lora)]):
            raise
        return None


def prefix_cache_applies(engine: Engine) -> bool:
    # A sliding-window model's state must keep its whole history to be cut back to a shorter common
    # prefix, which is what prefix reuse does: so with swa_full, and from a single-sequence context only
    # (llama.cpp saves one sequence of several with the last window alone; engine.kv.state_bytes).
    info = engine.info
    sliding = bool(info.sliding_window) and (any(info.swa_layers) if info.swa_layers else True)  # layout unknown: assume it has
    options = engine.options
    if options.n_seq_max > 1 and options.kv_unified:
        return False  # beam search's hypotheses: no one sequence to store
    return not sliding or (options.swa_full and options.n_seq_max == 1)


def _whole_states(engine: Engine) -> bool:
    """Whether this engine's states are kept whole (one chunk of all their tokens, used only whole): a
    recurrent or hybrid model's, whose state sums up every token before."""
    return engine.kv.whole_states_only


class EngineSeat:
    """Where a request's KV lives: a sequence of an engine (its tokens, context, state saved and restored).
    This one is the engine's own single sequence; a server slot is another (runtime.serving.scheduler.SlotSeat)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def tokens(self) -> list[int]:
        return self.engine.kv.tokens[0]

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def lora(self) -> tuple[float, ...]:
        return self.engine.lora

    def restore(self, data: bytearray, tokens: Sequence[int]) -> bool:
        return self.engine.kv.restore(data, tokens)

    def state_bytes(self) -> bytearray:
        return self.engine.kv.state_bytes()

    def shared(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` this place holds in memory (a server's slot: any of its slots)."""
        return common_prefix(self.tokens, tokens)

    def keep(self, n: int) -> None:
        """Nothing to cut: in this process the sequence holds only its own conversation (a server slot
        may hold another request's tokens: runtime.serving.scheduler.SlotSeat.keep)."""


@dataclass
class PrefixSnapshot:
    """What a seat held, read for the prefix cache before the seat is given back: its tokens, the chunks the
    cache lacks (`plan`) and, when it lacks any, the seat's KV state. `cut()` turns the state into those
    chunks (then the state itself is let go: only the new chunks wait to be written)."""

    tokens: list[int]
    plan: PrefixPlan
    ident: Identity
    model_ref: str
    n_ctx: int
    data: Optional[bytearray] = None
    pieces: Optional[dict[int, bytes]] = None

    def cut(self, engine: Engine) -> None:
        """The missing chunks out of the state (a whole state: one chunk of it all). A state StateLayout cannot
        cut is not stored: its cells are not one per token (an image's 2-D positions, as Qwen2-VL's), which
        would not restore either, or a layout it does not know."""
        if self.data is None or self.pieces is not None:
            return
        if self.plan.whole:
            self.pieces = {0: self.data}
        else:
            try:
                layout = StateLayout(self.data)
                if layout.base != 0 or layout.cells != len(self.tokens):
                    raise ValueError(f"a state of {layout.cells} cells from {layout.base} for {len(self.tokens)} tokens")
                self.pieces = {i: cut_state(self.data, layout, *self.plan.spans[i]) for i in self.plan.missing}
            except ValueError:
                self.pieces = {}
        self.data = None

    def held_bytes(self) -> int:
        return len(self.data or b"") + sum(len(piece) for piece in (self.pieces or {}).values())

    def write(self, store: SessionStore, cap: int) -> Optional[SessionInfo]:
        """Store the chunks (cut() first: the state itself is never written), touch those it passes through.
        Returns the chain it ends, or None."""
        if not self.pieces:  # every chunk stored already, or a state that cannot be cut
            store.touch_chunks(self.plan.path)
            return None
        return store.add_prefix_chunks(self.ident, self.plan, self.pieces, model_ref=self.model_ref, n_ctx=self.n_ctx, cap=cap)


class Sessions:
    """A session store used with engines: save and load sessions, look up and fill the prefix cache. What
    needs no engine (list, show, remove, prune, total_bytes ...) is the store's own."""

    def __init__(self, store: SessionStore, writer=None):
        self.store = store
        self.held_writer = writer

    @classmethod
    def open(cls, root: Optional[Path] = None, *, writing: Optional[str] = None,
             on_wait: Optional[Callable[[str], None]] = None, cancelled: Optional[Callable[[], bool]] = None) -> "Sessions":
        """The store under `root`. `writing`: a run's session, held for writing (store.writers) from now until
        `close`, so that what the run reads of it is still what it holds when it saves (a second run of it
        waits, then appends; one a chat holds is refused). `on_wait` hears that it waits; `cancelled()` ends
        the wait."""
        store = SessionStore.open(root)
        writer = None
        if writing:
            try:
                writer = store.writer(writing, RUN, on_wait=on_wait, cancelled=cancelled)
            except BaseException:
                store.close()
                raise
        return cls(store, writer)

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            if self.held_writer is not None:
                self.held_writer.release()

    def __enter__(self) -> "Sessions":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def save(self, name: str, engine: Engine, messages: list[dict], *, model_ref: str, seat=None) -> SessionInfo:
        """Save what the engine's KV cache holds (`seat`: that sequence of it) and `messages` as session `name`."""
        seat = seat or EngineSeat(engine)
        return self.store.save(name, identity(self.store, engine, seat_lora(seat)), list(seat.tokens), messages,
                               seat.state_bytes, model_ref=model_ref, n_ctx=seat.n_ctx)

    def messages(self, name: str, engine: Engine, n_ctx: int, lora: Optional[Sequence[float]] = None) -> list[dict]:
        """Session `name`'s messages, refused (as `load` would) when its state cannot go into this engine (under
        the LoRA scales `lora`: None, the engine's now)."""
        return self.store.messages(name, identity(self.store, engine, lora), n_ctx)

    def load(self, name: str, engine: Engine, seat=None, on_notice: Optional[Callable[[str], None]] = None) -> list[dict]:
        """Restore session `name` into the engine (`seat`: into that sequence of it, replacing what it holds)
        and return its messages: the next generation evaluates only the tokens after the restored ones."""
        seat = seat or EngineSeat(engine)

        def holds(tokens: list[int]) -> bool:
            # A resident model that answered this session last holds it: reading it back would gain nothing.
            # Nor when it holds all but a few tokens (as for the prefix cache): the prompt's reuse keeps
            # what matches and evaluates the rest.
            held = common_prefix(seat.tokens, tokens)
            return bool(tokens) and held >= min(len(tokens), MIN_PREFIX_TOKENS) and len(tokens) - held < MIN_PREFIX_TOKENS

        return self.store.load(name, identity(self.store, engine, seat_lora(seat)), seat.n_ctx, seat.restore, held=holds,
                               on_notice=on_notice)

    def lookup_prefix(self, engine: Engine, tokens: Sequence[int], *, on_notice: Optional[Callable[[str], None]] = None,
                      seat=None) -> int:
        """Restore the longest stored prefix of `tokens` (same model and settings) into the engine, from the
        chunks holding it, when that prefix is at least MIN_PREFIX_TOKENS long and longer than what the engine
        already holds of `tokens`. Returns how many leading tokens of `tokens` the engine now holds (0: nothing
        restored, the engine untouched). A damaged chunk is removed and reported through `on_notice` (once: it
        is gone), and the chunks before it restored. `seat`: the engine's sequence to restore into (its own
        single one by default)."""
        seat = seat or EngineSeat(engine)
        if len(tokens) < MIN_PREFIX_TOKENS or not prefix_cache_applies(engine) or cache_max_bytes() <= 0:
            return 0  # LOCALRUN_CACHE_MAX=0 turns the cache off: no lookups either
        # The engine re-evaluates a prompt's last token whatever it holds, so that one never counts.
        # What another slot of a server holds is copied into this one as the request starts: no disk read for that.
        limit = len(tokens) - 1
        have = min(seat.shared(tokens), limit)
        store, ident = self.store, _cache_identity(self.store, engine, seat_lora(seat))
        if ident is None:
            return 0
        chain = store.prefix_chain(prefix_root(ident), tokens, limit)
        if sum(n for _, n in chain) < MIN_PREFIX_TOKENS or sum(n for _, n in chain) <= have:
            return 0
        data, used = self._read_chain(chain, on_notice)
        if used < MIN_PREFIX_TOKENS or used <= have:
            return 0
        if not seat.restore(data, list(tokens[:used])):
            last = next(chunk for chunk, _ in reversed(chain) if chunk.start < used)
            store.drop_chunks([last])
            if on_notice:
                on_notice("llama.cpp could not restore the prefix cache's chunks of this prompt; the last one has been removed")
            return 0
        store.touch_chunks([chunk.key for chunk, _ in chain if chunk.start < used])
        return used

    def _read_chain(self, chain, on_notice) -> tuple[Optional[bytearray], int]:
        """The state of a chain's tokens put together from its chunks, and how many tokens it holds: all the
        chain's, or those before a chunk found damaged (removed, and said)."""
        store = self.store
        total = sum(n for _, n in chain)
        joiner, used = None, 0
        for chunk, n in chain:
            try:
                data = store.read_chunk(chunk)
                if chunk.whole:
                    return data, n  # (a whole state is its chain's one chunk)
                if joiner is None:
                    joiner = StateJoiner(data, total)
                joiner.add(data, n)
            except (CorruptState, ValueError) as exc:
                if isinstance(exc, CorruptState) and not store.chunk_stored(chunk):
                    break  # evicted by another process since the chain was looked up: not damage
                store.drop_chunks([chunk])
                if on_notice:
                    on_notice(f"a prefix-cache chunk was damaged ({exc}) and has been removed")
                break
            used += n
        if joiner is None or not used:
            return None, 0
        return joiner.result(), used

    def save_prefix(self, engine: Engine, seat=None) -> Optional[SessionInfo]:
        """Store the chunks of what the engine's KV cache holds (`seat`: that sequence of it) that the prefix
        cache lacks, unless it holds fewer than MIN_PREFIX_TOKENS tokens; chunks it passes through are marked
        used. Keeps the cache under $LOCALRUN_CACHE_MAX by evicting least-recently-used chunks. Returns the
        chain it ends, or None when nothing new was stored."""
        snapshot = self.prefix_snapshot(engine, seat)
        return None if snapshot is None else self.store_prefix(engine, snapshot)

    def prefix_snapshot(self, engine: Engine, seat=None) -> Optional[PrefixSnapshot]:
        """What save_prefix would store, read from the seat while it is held: its tokens, which chunks the cache
        lacks (the index, read without waiting for any lock) and, when it lacks some, the seat's KV state. None
        when nothing would be stored. `store_prefix` (or `store_prefix_later`) writes it once the seat is
        given back."""
        cap = cache_max_bytes()
        store = self.store
        if cap <= 0:
            store.trim_prefixes(0)  # off means off: chunks stored under a larger cap go too
            return None
        seat = seat or EngineSeat(engine)
        tokens = list(seat.tokens)
        if len(tokens) < MIN_PREFIX_TOKENS or not prefix_cache_applies(engine):
            return None
        ident = _cache_identity(store, engine, seat_lora(seat))
        if ident is None:
            return None
        plan = store.prefix_plan(prefix_root(ident), tokens, whole=_whole_states(engine))
        snapshot = PrefixSnapshot(tokens, plan, ident, engine.path.name, seat.n_ctx)
        if plan.missing:
            snapshot.data = seat.state_bytes()
        return snapshot

    def store_prefix(self, engine: Engine, snapshot: PrefixSnapshot) -> Optional[SessionInfo]:
        """Write a prefix_snapshot to the cache, here and now (see save_prefix)."""
        snapshot.cut(engine)
        return snapshot.write(self.store, cache_max_bytes())

    def store_prefix_later(self, engine: Engine, snapshot: PrefixSnapshot,
                           on_notice: Optional[Callable[[str], None]] = None) -> None:
        """Write a prefix_snapshot on the process's PrefixWriter thread: the state is cut into the chunks to
        write here (and let go), the writing and fsyncing happen there. What goes wrong there is said to
        `on_notice` (the request may be over by then: a notice it cannot take is dropped)."""
        snapshot.cut(engine)
        WRITER.submit(self.store.root, snapshot, cache_max_bytes(), on_notice)


def cache_skipped(exc: BaseException) -> str:
    """How a prefix-cache failure is said: the cache only saves time, so the answer goes on without it."""
    return f"prefix cache skipped: {getattr(exc, 'message', None) or exc}"


class PrefixWriter:
    """One thread per process that writes prefix-cache chunks after their requests are over (a server's: its
    next request never waits for them). The chunks waiting to be written are held in memory, at most
    MAX_WAITING_BYTES of them: past that the oldest snapshot still waiting is dropped for a new one, as the
    cache only saves time (the newest always waits). The process waits for what is under way and waiting when
    it exits (`wait`, at exit)."""

    MAX_WAITING_BYTES = 1 << 30

    def __init__(self):
        self.cond = threading.Condition()
        self.waiting: collections.deque = collections.deque()
        self.writing = 0
        self.thread: Optional[threading.Thread] = None

    def submit(self, root: Path, snapshot: PrefixSnapshot, cap: int, on_notice: Optional[Callable[[str], None]]) -> None:
        with self.cond:
            self.waiting.append((root, snapshot, cap, on_notice))
            while len(self.waiting) > 1 and sum(job[1].held_bytes() for job in self.waiting) > self.MAX_WAITING_BYTES:
                self.waiting.popleft()
            if self.thread is None or not self.thread.is_alive():
                if self.thread is None:
                    atexit.register(self._at_exit)
                self.thread = threading.Thread(target=self._run, name="localrun-prefix-writer", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until every snapshot handed over is written (or dropped); False when `timeout` came first."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.waiting and not self.writing, timeout)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.waiting:
                    self.cond.wait()
                root, snapshot, cap, on_notice = self.waiting.popleft()
                self.writing += 1
            try:
                with SessionStore.open(root) as store:
                    snapshot.write(store, cap)
            except (SessionError, sqlite3.DatabaseError, OSError) as exc:
                if on_notice is not None:
                    try:
                        on_notice(cache_skipped(exc))
                    except Exception:  # noqa: BLE001 - the request's stream is closed: nobody to tell
                        pass
            except Exception:  # noqa: BLE001 - a writer that dies would leave every later save waiting
                import traceback

                traceback.print_exc()
            finally:
                with self.cond:
                    self.writing -= 1
                    self.cond.notify_all()

    def _at_exit(self) -> None:
        try:
            self.wait(60.0)
        except KeyboardInterrupt:  # a second Ctrl-C at exit: leave (what was being written is swept next time)
            pass


WRITER = PrefixWriter()


def wait_for_saves(timeout: Optional[float] = None) -> bool:
    """Wait until the prefix-cache chunks this process handed to its writer are on disk (a server stopping,
    a test reading the cache); False when `timeout` came first."""
    return WRITER.wait(timeout)
