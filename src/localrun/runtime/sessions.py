"""Named sessions and the prefix cache for a loaded engine: the store keeps bytes, tokens and identities on
disk; this takes them from the engine's KV cache and gives them back, and picks the longest stored prefix
of a prompt (engine.kv's common_prefix, the one prefix comparison)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..engine import Engine
from ..engine.kv import common_prefix
from ..engine.llama import build_id, build_system_info
from ..store.sessions import MIN_PREFIX_TOKENS, CorruptState, Identity, SessionInfo, SessionStore, cache_max_bytes
from ..store.writers import RUN

_identities: "weakref.WeakKeyDictionary[Engine, Identity]" = weakref.WeakKeyDictionary()


def identity(store: SessionStore, engine: Engine) -> Identity:
    """What a state made by this engine depends on (the model file's sha256 is cached by the store)."""
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


class EngineSeat:
    """Where a request's KV lives: a sequence of an engine (its tokens, context, state saved and restored).
    This one is the engine's own single sequence; a server slot is another (runtime.scheduler.SlotSeat)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def tokens(self) -> list[int]:
        return self.engine.kv.tokens[0]

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    def restore(self, data: bytearray, tokens: Sequence[int]) -> bool:
        return self.engine.kv.restore(data, tokens)

    def state_bytes(self) -> bytearray:
        return self.engine.kv.state_bytes()

    def shared(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` this place holds in memory (a server's slot: any of its slots)."""
        return common_prefix(self.tokens, tokens)

    def keep(self, n: int) -> None:
        """Nothing to cut: in this process the sequence holds only its own conversation (a server slot
        may hold another request's tokens: runtime.scheduler.SlotSeat.keep)."""


@dataclass
class PrefixSnapshot:
    """A seat's tokens and KV state, read to be stored as a prefix entry once the seat is given back."""

    tokens: list[int]
    data: bytearray
    n_ctx: int


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
        return self.store.save(name, identity(self.store, engine), list(seat.tokens), messages,
                               seat.state_bytes, model_ref=model_ref, n_ctx=seat.n_ctx)

    def messages(self, name: str, engine: Engine, n_ctx: int) -> list[dict]:
        """Session `name`'s messages, refused (as `load` would) when its state cannot go into this engine."""
        return self.store.messages(name, identity(self.store, engine), n_ctx)

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

        return self.store.load(name, identity(self.store, engine), seat.n_ctx, seat.restore, held=holds, on_notice=on_notice)

    def lookup_prefix(self, engine: Engine, tokens: Sequence[int], *, on_notice: Optional[Callable[[str], None]] = None,
                      seat=None) -> int:
        """Restore the stored state sharing the longest prefix with `tokens` (same model and settings) into
        the engine, when that prefix is at least MIN_PREFIX_TOKENS long and longer than what the engine
        already holds of `tokens`. Returns how many leading tokens of `tokens` the engine now holds (0: nothing
        restored, the engine untouched). A damaged entry is removed and reported through `on_notice`. `seat`:
        the engine's sequence to restore into (its own single one by default)."""
        seat = seat or EngineSeat(engine)
        if len(tokens) < MIN_PREFIX_TOKENS or not prefix_cache_applies(engine) or cache_max_bytes() <= 0:
            return 0  # LOCALRUN_CACHE_MAX=0 turns the cache off: no lookups either
        # The engine re-evaluates a prompt's last token whatever it holds, so that one never counts.
        # What another slot of a server holds is copied into this one as the request starts: no disk read for that.
        have = min(seat.shared(tokens), len(tokens) - 1)
        store, ident = self.store, identity(self.store, engine)
        with store.prefix_locked():
            best, best_len = None, 0
            for entry in store.prefix_entries(ident, tokens):
                if len(entry.tokens) >= seat.n_ctx:
                    continue
                n = common_prefix(entry.tokens, tokens)
                if n > best_len:
                    best, best_len = entry, n
            if best is None or best_len < MIN_PREFIX_TOKENS or min(best_len, len(tokens) - 1) <= have:
                return 0
            try:
                data = store.read_state(best)
            except CorruptState as exc:
                store.drop(best)
                if on_notice:
                    on_notice(f"a prefix-cache entry was corrupt ({exc}) and has been removed")
                return 0
            if not seat.restore(data, best.tokens):
                store.drop(best)
                if on_notice:
                    on_notice("llama.cpp could not restore a prefix-cache entry; it has been removed")
                return 0
            store.touch(best)
        return best_len

    def save_prefix(self, engine: Engine, seat=None) -> Optional[SessionInfo]:
        """Store the engine's KV cache (`seat`: that sequence of it) as a prefix entry, unless it is shorter than MIN_PREFIX_TOKENS or an
        entry already covers it; entries it extends are replaced. Keeps the prefix cache under
        $LOCALRUN_CACHE_MAX by evicting least-recently-used entries. Returns the new entry, or None."""
        snapshot = self.prefix_snapshot(engine, seat)
        return None if snapshot is None else self.store_prefix(engine, snapshot)

    def prefix_snapshot(self, engine: Engine, seat=None) -> Optional["PrefixSnapshot"]:
        """What save_prefix would store, read from the seat (its tokens and KV state), or None when nothing would
        be: the seat can then take another request while `store_prefix` writes it to disk."""
        cap = cache_max_bytes()
        store = self.store
        if cap <= 0:
            store.trim_prefixes(0)  # off means off: entries stored under a larger cap go too
            return None
        seat = seat or EngineSeat(engine)
        tokens = list(seat.tokens)
        if len(tokens) < MIN_PREFIX_TOKENS or not prefix_cache_applies(engine):
            return None
        ident = identity(store, engine)
        with store.prefix_locked():
            for entry in store.prefix_entries(ident, tokens):
                if common_prefix(entry.tokens, tokens) == len(tokens):
                    store.touch(entry)  # already stored, maybe with more after it
                    return None
        return PrefixSnapshot(tokens, seat.state_bytes(), seat.n_ctx)

    def store_prefix(self, engine: Engine, snapshot: "PrefixSnapshot") -> Optional[SessionInfo]:
        """Write a prefix_snapshot to the cache (see save_prefix)."""
        cap = cache_max_bytes()
        store, tokens = self.store, snapshot.tokens
        ident = identity(store, engine)
        with store.prefix_locked():
            superseded = []
            for entry in store.prefix_entries(ident, tokens):
                n = common_prefix(entry.tokens, tokens)
                if n == len(tokens):
                    store.touch(entry)  # stored meanwhile (another request's answer)
                    return None
                if n == len(entry.tokens):
                    superseded.append(entry)
            return store.add_prefix(ident, tokens, snapshot.data, replaces=superseded,
                                    model_file=engine.path.name, n_ctx=snapshot.n_ctx, cap=cap)
