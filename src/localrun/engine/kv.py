"""The KV cache: which tokens each sequence holds, longest-prefix reuse, and state save/restore.

Every reuse of a cached prefix goes through here: a prompt extending what a sequence already holds (run,
chat), a server slot taking over another slot's longer prefix, a prefix-cache entry or a session restored
from disk, and a conversation's next prompt built on the last one's tokens.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Optional

from ..errors import EngineError, SessionError
from .llama import llama_cpp_module

ALL_SEQUENCES = -1
_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic, at the head of every sequence state
_BLOCK = 64


def image_start(tokens: Sequence[int], n: int) -> int:
    """`n`, or where the image it falls inside starts: an image's tokens (negative ids, engine.vision) are
    evaluated whole, so a prefix kept in the KV never ends part-way through one. (Two images side by side
    count as one run here: the second is then evaluated again, never a part of either.)"""
    while 0 < n < len(tokens) and tokens[n] < 0 and tokens[n - 1] < 0:
        n -= 1
    return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two token sequences share (lists or arrays; compared a block at a time)."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + _BLOCK, n)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def extend_tokens(known_tokens: Sequence[int], known_text: str, text: str, tokenize: Callable[..., list[int]]) -> list[int]:
    """The tokens of `text`, built on `known_tokens` (which spell `known_text`) when `text` extends it: only
    the new part is tokenized, so what the model generated keeps its own tokens (llama-cli does this for a
    conversation's next turn; tokenizing the whole text again may split it differently)."""
    if known_tokens and text.startswith(known_text):
        return [*known_tokens, *tokenize(text[len(known_text):], add_special=False, parse_special=True)]
    return tokenize(text, add_special=True, parse_special=True)


class KVCache:
    """The tokens whose KV each sequence holds, in order, kept in step with llama.cpp's memory."""

    def __init__(self, ctx, n_seq: int, sliding_window: Optional[int] = None, unified: bool = False):
        self._ll = llama_cpp_module()
        self.ctx = ctx
        self.memory = self._ll.llama_get_memory(ctx)
        self.n_seq = n_seq
        self.n_stream = 1 if unified else n_seq  # llama.cpp's KV streams: one per sequence unless unified
        self.sliding_window = sliding_window or 0
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]

    # -- bookkeeping ---------------------------------------------------------------------------

    def clear(self, seq: Optional[int] = None) -> None:
        """Forget one sequence, or all of them (None)."""
        if seq is None:
            self._ll.llama_memory_clear(self.memory, True)
            for toks in self.tokens:
                toks.clear()
        else:
            self._ll.llama_memory_seq_rm(self.memory, seq, 0, -1)
            self.tokens[seq].clear()

    def truncate(self, seq: int, n_keep: int) -> bool:
        """Drop what `seq` holds from position n_keep on. False when the memory cannot remove a part (a
        recurrent model), or when what is left could not be continued exactly: then the whole sequence goes."""
        if self._ll.llama_memory_seq_rm(self.memory, seq, n_keep, -1) and self._window_intact(seq, n_keep):
            del self.tokens[seq][n_keep:]
            return True
        self.clear(seq if self.n_seq > 1 else None)
        return False

    def _window_intact(self, seq: int, n_keep: int) -> bool:
        """Whether a sliding-window layer still has every cell the next token (at position n_keep) attends
        to. A state saved from one of several sequences keeps only the last window of those layers
        (llama.cpp leaves out the cells its attention masks), so it can be extended but not cut back far;
        llama.cpp's server re-evaluates such a prompt from the start, and so does this."""
        window = self.sliding_window
        if not window or n_keep == 0:
            return True
        first = self._ll.llama_memory_seq_pos_min(self.memory, seq)  # of the window's cells; -1: none left
        return 0 <= first <= max(0, n_keep - window + 1)

    def reuse(self, seq: int, prompt: Sequence[int]) -> int:
        """Keep the longest prefix `seq` shares with `prompt` and drop the rest; returns how many tokens were
        kept. The prompt's last token is never kept: its logits are the ones to sample from."""
        keep = image_start(prompt, min(common_prefix(self.tokens[seq], prompt), len(prompt) - 1))
        if keep < len(self.tokens[seq]) and not self.truncate(seq, keep):
            keep = 0
        return keep

    def reuse_from(self, seq: int, prompt: Sequence[int], donors: Sequence[int]) -> int:
        """As reuse(), but when another sequence among `donors` holds a longer prefix of `prompt`, copy it
        into `seq` first (a server slot taking the prefix another slot evaluated)."""
        limit = len(prompt) - 1
        keep = min(common_prefix(self.tokens[seq], prompt), limit)
        donor, donor_keep = None, keep
        for other in donors:
            if other != seq:
                n = min(common_prefix(self.tokens[other], prompt), limit)
                if n > donor_keep:
                    donor, donor_keep = other, n
        if donor is None or image_start(prompt, donor_keep) <= image_start(prompt, keep):
            return self.reuse(seq, prompt)
        self.copy(donor, seq)
        donor_keep = image_start(prompt, donor_keep)
        return donor_keep if self.truncate(seq, donor_keep) else 0

    def copy(self, src: int, dst: int) -> None:
        """Make `dst` hold what `src` holds. A whole-sequence copy: per-sequence KV streams copy only whole
        sequences (trim after it with truncate)."""
        ll = self._ll
        ll.llama_memory_seq_rm(self.memory, dst, 0, -1)
        ll.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
        self.tokens[dst] = list(self.tokens[src])

    def held(self) -> int:
        return sum(len(t) for t in self.tokens)

    # -- state save and restore ------------------------------------------------------------------
    #
    # Saved states are in one format whatever context made them: llama.cpp's state of one sequence in a
    # context with a single KV stream. A context of several sequences keeps one stream per sequence (see
    # runtime.loader), and llama.cpp's state of a sequence there names every stream (all but its own empty):
    # `_restream` rewrites that header, so a session a server slot saved resumes in-process and back.

    def state_bytes(self, seq: int = 0, *, raw: bool = False) -> bytearray:
        """The KV state of sequence `seq`, in the one saved format (`raw`: as llama.cpp wrote it; `portable`
        makes it the saved format).

        llama.cpp's state of one sequence keeps only the last window of a model's sliding-window layers
        (the cells their attention masks now). Where a model has such layers this takes the state of all
        sequences (-1), which keeps every cell (the engine keeps them with swa_full), and of it this
        sequence's own: so a restored gemma-3 state can also be cut back to a shorter common prefix, as a
        resumed session's last answer often is. (A windowed state, should one be restored, is never cut
        back wrongly: truncate knows.)"""
        ll = self._ll
        # One sequence of several with sliding-window layers: the state of all of them (each stream's cells,
        # unmasked), from which `portable` takes this sequence's stream.
        whole = self.n_seq == 1 or (self.sliding_window and self.n_stream == self.n_seq)
        which = ALL_SEQUENCES if whole else seq
        size = ll.llama_state_seq_get_size(self.ctx, which)
        data = bytearray(size)
        written = ll.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, which)
        if written != size:
            raise EngineError(f"llama.cpp wrote {written} of {size} bytes of KV state: the state was not saved")
        return data if raw else self.portable(data, seq)

    def portable(self, data: bytearray, seq: int = 0) -> bytearray:
        """A state of sequence `seq` of this context (state_bytes(raw=True)) as it is saved: one KV stream.
        SessionError for a layout this cannot rewrite (cells carrying more than positions and sequence ids)."""
        if self.n_stream == 1:
            return data
        return _rewrite(data, 1, take=seq if self.sliding_window and self.n_stream == self.n_seq else None)

    def for_this_context(self, data: bytearray) -> bytearray:
        """A saved state as llama.cpp reads it into this context (its number of KV streams)."""
        return data if self.n_stream == 1 else _rewrite(data, self.n_stream)

    def restore(self, data: bytearray, tokens: Sequence[int], seq: int = 0, *, ready: bool = False) -> bool:
        """Make sequence `seq` hold `data` (from state_bytes, of any context; `ready`: for_this_context
        made it already) holding `tokens`. On failure the sequence is left empty and False is returned."""
        ll = self._ll
        if not ready:
            data = self.for_this_context(data)
        self.clear(seq if self.n_seq > 1 else None)
        if not data:
            return False
        read = ll.llama_state_seq_set_data(self.ctx, (ctypes.c_uint8 * len(data)).from_buffer(data), len(data), seq)
        # The cells must be exactly positions 0..len(tokens)-1, or the token list would lie about the cache.
        if read == 0 or ll.llama_memory_seq_pos_max(self.memory, seq) != len(tokens) - 1:
            self.clear(seq if self.n_seq > 1 else None)
            return False
        self.tokens[seq] = list(tokens)
        return True


def _rewrite(data: bytearray, n_stream: int, take: Optional[int] = None) -> bytearray:
    try:
        return _restream(data, n_stream, take)
    except ValueError as exc:
        raise SessionError(f"this model's KV state cannot move between a server slot and a single-sequence context ({exc}):"
                           " answer it in-process (--keep-alive 0) to use sessions and the prefix cache") from None


def _restream(data: bytearray, n_stream: int, take: Optional[int] = None) -> bytearray:
    """A one-sequence KV state with its header rewritten for a context of `n_stream` KV streams: `data`
    itself where it can be rewritten in place (it is, then; a copy of a large state costs more than the
    restore), else a new buffer.

    llama.cpp writes a magic number and the sequence's id, then per cache (two for a model with
    sliding-window layers): the stream count, then per stream its cell count and, when not 0, the cells'
    positions and sequence ids and then each layer's K and V rows (src/llama-kv-cache.cpp, state_write).
    One stream holds the sequence; the rest are empty. Reading a sequence's state puts those cells in
    that sequence's stream, wherever they were written. `take`: a state of all sequences, one per stream:
    keep stream `take` only (its sequence's cells). ValueError for a state this cannot read (another
    layout): the caller evaluates the prompt instead."""
    import struct

    try:
        parts = _parts(memoryview(data), take)
    except struct.error:
        raise ValueError("a torn KV state") from None
    zero = struct.pack("<I", 0)
    if len(parts) == 1 and parts[0][1] is not None and isinstance(data, bytearray):  # one cache: in place
        head, (start, end), stop = parts[0]
        del data[end:]
        data += zero * (n_stream - 1)
        del data[head + 4 : start]
        data[head : head + 4] = struct.pack("<I", n_stream)
        return data
    view = memoryview(data)
    out = bytearray(view[:8])
    for _, section, _ in parts:
        out += struct.pack("<I", n_stream)
        out += view[section[0] : section[1]] if section else zero
        out += zero * (n_stream - 1)
    return out


def _parts(view: memoryview, take: Optional[int]) -> list[tuple[int, Optional[tuple[int, int]], int]]:
    """Per cache in a state: (offset of its stream count, (start, end) of the one stream section kept or
    None when all are empty, offset after it)."""
    import struct

    if struct.unpack_from("<I", view, 0)[0] != _STATE_MAGIC:
        raise ValueError("not a KV state")
    parts = []
    at = 8
    while at < len(view):
        head = at
        (streams,) = struct.unpack_from("<I", view, at)
        at += 4
        if not 0 < streams <= 4096:
            raise ValueError("not a KV state")
        held = []
        for index in range(streams):
            start = at
            (cells,) = struct.unpack_from("<I", view, at)
            at += 4
            if cells:
                at = _skip_cells(view, at, cells)
                if take is None or index == take:
                    held.append((start, at))
        if len(held) > 1:
            raise ValueError("a state of several streams")
        parts.append((head, held[0] if held else None, at))
    if at != len(view):
        raise ValueError("a torn KV state")
    return parts


def _skip_cells(view: memoryview, at: int, cells: int) -> int:
    """The offset after a stream's cells (their metadata, then every layer's K and V rows)."""
    import struct

    for _ in range(cells):
        _, n_seq = struct.unpack_from("<iI", view, at)
        at += 8 + 4 * n_seq
    v_trans, n_layer = struct.unpack_from("<II", view, at)
    at += 8
    for _ in range(n_layer):  # K: type, row size, rows
        (row,) = struct.unpack_from("<Q", view, at + 4)
        at += 12 + cells * row
    for _ in range(n_layer):  # V: rows, or transposed: element size, width, columns
        if v_trans:
            size, width = struct.unpack_from("<II", view, at + 4)
            at += 12 + width * cells * size
        else:
            (row,) = struct.unpack_from("<Q", view, at + 4)
            at += 12 + cells * row
        if at > len(view):
            raise ValueError("a torn KV state")
    return at
