"""The KV cache: which tokens each sequence holds, longest-prefix reuse, and state save/restore.

Every reuse of a cached prefix goes through here: a prompt extending what a sequence already holds (run,
chat), a server slot taking over another slot's longer prefix, a prefix-cache entry or a session restored
from disk, and a conversation's next prompt built on the last one's tokens.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Optional

from ..errors import EngineError, Phrase, SessionError
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
        # The LoRA adapters and scales (engine.lora.lora_key) the context decodes under now, and those each
        # sequence's KV was made under: a sequence is reused, copied or extended only under its own.
        self.current: tuple = ()
        self.made_with: list[tuple] = [() for _ in range(n_seq)]

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

    def matches(self, seq: int, key: Optional[tuple] = None) -> bool:
        """Whether what `seq` holds was made under the adapters `key` (default: the context's now): an empty
        sequence matches any."""
        return not self.tokens[seq] or self.made_with[seq] == (self.current if key is None else key)

    def reuse(self, seq: int, prompt: Sequence[int]) -> int:
        """Keep the longest prefix `seq` shares with `prompt` and drop the rest; returns how many tokens were
        kept. The prompt's last token is never kept: its logits are the ones to sample from. What the sequence
        holds under other LoRA adapters or scales is dropped whole."""
        if not self.matches(seq):
            self.clear(seq if self.n_seq > 1 else None)
            return 0
        keep = image_start(prompt, min(common_prefix(self.tokens[seq], prompt), len(prompt) - 1))
        if keep < len(self.tokens[seq]) and not self.truncate(seq, keep):
            keep = 0
        return keep

    def reuse_from(self, seq: int, prompt: Sequence[int], donors: Sequence[int], key: Optional[tuple] = None) -> int:
        """As reuse(), but when another sequence among `donors` holds a longer prefix of `prompt`, copy it
        into `seq` first (a server slot taking the prefix another slot evaluated). `key`: the adapters the
        prompt will be evaluated under (default: the context's now); sequences made under others are no
        donors, and `seq` itself is emptied when it holds such."""
        key = self.current if key is None else key
        if not self.matches(seq, key):
            self.clear(seq)
        donors = [other for other in donors if self.matches(other, key)]
        limit = len(prompt) - 1
        keep = min(common_prefix(self.tokens[seq], prompt), limit)
        donor, donor_keep = None, keep
        for other in donors:
            if other != seq:
                n = min(common_prefix(self.tokens[other], prompt), limit)
                if n > donor_keep:
                    donor, donor_keep = other, n
        if donor is None or image_start(prompt, donor_keep) <= image_start(prompt, keep):
            keep = image_start(prompt, keep)
            return keep if keep >= len(self.tokens[seq]) or self.truncate(seq, keep) else 0
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
        self.made_with[dst] = self.made_with[src]

    def held(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def whole_states_only(self) -> bool:
        """A recurrent or hybrid model's memory: its state sums up every token before, and cannot be cut into
        token ranges (StateLayout) nor cut back to a shorter prefix."""
        ll = self._ll
        model = ll.llama_get_model(self.ctx)
        return bool(ll.llama_model_is_recurrent(model) or ll.llama_model_is_hybrid(model))

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

    def restore(self, data: bytearray, tokens: Sequence[int], seq: int = 0, *, ready: bool = False,
                made_with: Optional[tuple] = None) -> bool:
        """Make sequence `seq` hold `data` (from state_bytes, of any context; `ready`: for_this_context
        made it already) holding `tokens`, made under the LoRA adapters `made_with` (default: the context's
        now; the store keys states by them). On failure the sequence is left empty and False is returned."""
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
        self.made_with[seq] = self.current if made_with is None else made_with
        return True


def _rewrite(data: bytearray, n_stream: int, take: Optional[int] = None) -> bytearray:
    try:
        return _restream(data, n_stream, take)
    except ValueError as exc:
        raise SessionError(Phrase("this model's KV state cannot move between a server slot and a single-sequence context"
                                  " ({why}): answer it in-process ({keep_alive} 0) to use sessions and the prefix cache",
                                  why=exc)) from None


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


# -- a state cut into token ranges, and ranges put back together ------------------------------------
#
# The prefix cache keeps a prompt's KV in chunks of consecutive tokens (runtime.sessions), so that prompts
# sharing their first tokens share those chunks on disk. A chunk is itself a state in the saved format (one
# KV stream) holding only the cells of its tokens: llama.cpp's state is, per cache (two for a model with
# sliding-window layers), the cells' metadata (position, sequence ids, and for some models a 2-D position and
# token), then per layer every cell's K row, then every cell's V row or, with V transposed (no flash
# attention), per embedding dimension a row of every cell's value (src/llama-kv-cache.cpp, state_write_data).
# A cell's rows depend only on its own token and those before it, so the cells of positions a..b-1 with their
# rows are the KV of those tokens, and chunks holding 0..a-1 and a..b-1 put together are the state of 0..b-1.


class _Section:
    """One KV cache's cells in a one-stream state: where their metadata, K rows and V rows lie."""

    __slots__ = ("cells", "base", "meta", "cell_size", "order", "head", "k", "v", "v_trans", "end")

    def __init__(self, cells, base, meta, cell_size, order, head, k, v, v_trans, end):
        self.cells = cells  # how many (all of one sequence, positions base..base+cells-1)
        self.base = base
        self.meta = meta  # offset of the first cell's metadata
        self.cell_size = cell_size  # bytes of one cell's metadata
        self.order = order  # the cells in position order (numpy indices), None when written in that order
        self.head = head  # offset of v_trans and n_layer
        self.k = k  # per layer: (offset of its 12-byte header, offset of its rows, bytes per row)
        self.v = v  # per layer: (header offset, rows offset, bytes per row) or transposed (…, element size, width)
        self.v_trans = v_trans
        self.end = end

    def shape(self, view) -> tuple:
        """What two chunks of one state share: the headers of every layer, the metadata's size."""
        heads = b"".join(bytes(view[h : h + 12]) for h, *_ in (*self.k, *self.v))
        return self.cell_size, self.v_trans, len(self.k), heads


class StateLayout:
    """Where everything lies in a one-sequence state in the saved format (KVCache.state_bytes): the cells of
    each cache, in position order, positions `base`..`base + cells - 1`. ValueError for a state that cannot
    be cut into token ranges: a recurrent model's, one whose cells are not one per position (an image with
    2-D positions), a layout this does not know."""

    def __init__(self, data):
        import struct

        view = memoryview(data)
        if len(view) < 8 or struct.unpack_from("<I", view, 0)[0] != _STATE_MAGIC:
            raise ValueError("not a KV state")
        self.sections: list[_Section] = []
        at = 8
        try:
            while at < len(view):
                (streams,) = struct.unpack_from("<I", view, at)
                if streams != 1:
                    raise ValueError(f"a state of {streams} KV streams")
                (cells,) = struct.unpack_from("<I", view, at + 4)
                if not cells:
                    raise ValueError("a cache with no cells")
                section = _section(view, at + 8, cells)
                self.sections.append(section)
                at = section.end
        except struct.error:
            raise ValueError("a torn KV state") from None
        if not self.sections or at != len(view):
            raise ValueError("a torn KV state")
        first = self.sections[0]
        if any(s.cells != first.cells or s.base != first.base for s in self.sections):
            raise ValueError("caches holding different cells")
        self.cells, self.base = first.cells, first.base

    def shape(self, view) -> tuple:
        return tuple(s.shape(view) for s in self.sections)


def _section(view: memoryview, meta: int, cells: int) -> _Section:
    """The cache section whose `cells` cells' metadata starts at `meta`: each cell is one position of one
    sequence (a position, the sequence count 1, maybe a 12-byte extension, the sequence id). The extension's
    presence is not written down: the reading that parses to the end of the section is the one."""
    import struct

    failure = None
    for cell_size in (12, 24):
        try:
            return _section_of(view, meta, cells, cell_size)
        except (ValueError, struct.error) as exc:
            failure = failure or exc
    raise ValueError(f"not a KV cache section ({failure})")


def _section_of(view: memoryview, meta: int, cells: int, cell_size: int) -> _Section:
    import struct

    import numpy as np

    size = cells * cell_size
    if meta + size + 8 > len(view):
        raise ValueError("a torn KV state")
    fields = np.frombuffer(view, dtype="<i4", count=size // 4, offset=meta).reshape(cells, cell_size // 4)
    if not (fields[:, 1] == 1).all():
        raise ValueError("cells shared by several sequences")
    positions = fields[:, 0]
    order = np.argsort(positions, kind="stable")
    base = int(positions[order[0]])
    if base < 0 or not np.array_equal(positions[order], np.arange(base, base + cells, dtype=positions.dtype)):
        raise ValueError("cells that are not one per position")
    if np.array_equal(order, np.arange(cells)):
        order = None
    at = meta + size
    v_trans, n_layer = struct.unpack_from("<II", view, at)
    if v_trans > 1 or not 0 < n_layer <= 4096:
        raise ValueError("not a KV cache section")
    head = at
    at += 8
    k = []
    for _ in range(n_layer):
        kind, row = struct.unpack_from("<iQ", view, at)
        if not 0 <= kind < 1024 or not 0 < row < 1 << 32:
            raise ValueError("not a K row header")
        k.append((at, at + 12, row))
        at += 12 + cells * row
    try:
        v, end = _values(view, at, cells, n_layer, v_trans)
    except (ValueError, struct.error):
        if at != len(view):
            raise
        v, end = [], at  # a model whose attention keeps no V (DeepSeek's MLA: V is read from K)
    at = end
    return _Section(cells, base, meta, cell_size, order, head, k, v, bool(v_trans), at)


def _values(view: memoryview, at: int, cells: int, n_layer: int, v_trans: int) -> tuple[list, int]:
    """The V section's layers (see _Section.v) starting at `at`, and the offset after them."""
    import struct

    v = []
    for _ in range(n_layer):
        if v_trans:
            kind, element, width = struct.unpack_from("<iII", view, at)
            if not 0 <= kind < 1024 or not 0 < element <= 64 or not 0 < width < 1 << 24:
                raise ValueError("not a V header")
            v.append((at, at + 12, element, width))
            at += 12 + width * cells * element
        else:
            kind, row = struct.unpack_from("<iQ", view, at)
            if not 0 <= kind < 1024 or not 0 < row < 1 << 32:
                raise ValueError("not a V row header")
            v.append((at, at + 12, row))
            at += 12 + cells * row
        if at > len(view):
            raise ValueError("a torn KV state")
    return v, at


def cut_state(data, layout: StateLayout, start: int, end: int) -> bytearray:
    """The state of the cells at positions `start`..`end - 1` of `data` (laid out as `layout` says): a chunk,
    in the saved format, that join_states puts back beside its neighbours."""
    import struct

    import numpy as np

    if not layout.base <= start < end <= layout.base + layout.cells:
        raise ValueError(f"positions {start}..{end} are not in this state")
    view = memoryview(data)
    out = bytearray(view[:8])
    n = end - start
    for s in layout.sections:
        a, b = start - s.base, end - s.base
        pick = s.order[a:b] if s.order is not None else None

        def rows(offset: int, row: int):
            if pick is None:
                return view[offset + a * row : offset + b * row]
            return np.frombuffer(view, np.uint8, s.cells * row, offset).reshape(s.cells, row)[pick].tobytes()

        out += struct.pack("<II", 1, n)
        out += rows(s.meta, s.cell_size)
        out += view[s.head : s.head + 8]
        for header, offset, row in s.k:
            out += view[header : header + 12]
            out += rows(offset, row)
        for header, offset, *size in s.v:
            out += view[header : header + 12]
            if not s.v_trans:
                out += rows(offset, size[0])
                continue
            element, width = size
            values = np.frombuffer(view, np.uint8, width * s.cells * element, offset).reshape(width, s.cells, element)
            out += (values[:, a:b] if pick is None else values[:, pick]).tobytes()
    return out


class StateJoiner:
    """Chunks of one state (cut_state), added in position order from position 0, put together into the state
    of all their cells: the buffer is made once, at its full size, and each chunk copied into place (a long
    prompt's state is hundreds of megabytes: no second copy of it)."""

    def __init__(self, first, cells: int):
        self.layout = StateLayout(first)
        view = memoryview(first)
        self.shape = self.layout.shape(view)
        self.cells, self.filled = cells, 0
        size = 8
        self.places = []  # per section: (offset of its metadata, [per K layer rows offset], [per V layer ...])
        for s in self.layout.sections:
            meta = size + 8
            size = meta + cells * s.cell_size + 8
            k = []
            for _, _, row in s.k:
                k.append(size + 12)
                size += 12 + cells * row
            v = []
            for _, _, *rest in s.v:
                v.append(size + 12)
                size += 12 + (rest[1] * cells * rest[0] if s.v_trans else cells * rest[0])
            self.places.append((meta, k, v))
        self.out = bytearray(size)
        self.out[:8] = view[:8]
        import struct

        for s, (meta, k, v) in zip(self.layout.sections, self.places):
            struct.pack_into("<II", self.out, meta - 8, 1, cells)
            self.out[meta + cells * s.cell_size : meta + cells * s.cell_size + 8] = view[s.head : s.head + 8]
            for (header, _, _), at in zip(s.k, k):
                self.out[at - 12 : at] = view[header : header + 12]
            for (header, *_), at in zip(s.v, v):
                self.out[at - 12 : at] = view[header : header + 12]

    def add(self, data, take: Optional[int] = None) -> None:
        """Put the first `take` cells (all by default) of chunk `data` next. ValueError for a chunk that does not
        continue this state: another layout, or cells that do not start where the last chunk ended."""
        import numpy as np

        layout = StateLayout(data)
        view = memoryview(data)
        take = layout.cells if take is None else take
        if layout.shape(view) != self.shape:
            raise ValueError("a chunk of another layout")
        if layout.base != self.filled or not 0 < take <= layout.cells or self.filled + take > self.cells:
            raise ValueError(f"a chunk of positions {layout.base}.. where {self.filled} comes next")
        at, out = self.filled, self.out
        for s, (meta, k, v) in zip(layout.sections, self.places):
            pick = s.order[:take] if s.order is not None else None

            def put(dst: int, src: int, row: int) -> None:
                if pick is None:
                    out[dst + at * row : dst + (at + take) * row] = view[src : src + take * row]
                else:
                    rows = np.frombuffer(view, np.uint8, s.cells * row, src).reshape(s.cells, row)
                    out[dst + at * row : dst + (at + take) * row] = rows[pick].tobytes()

            put(meta, s.meta, s.cell_size)
            for (_, src, row), dst in zip(s.k, k):
                put(dst, src, row)
            for (_, src, *size), dst in zip(s.v, v):
                if not s.v_trans:
                    put(dst, src, size[0])
                    continue
                element, width = size
                values = np.frombuffer(view, np.uint8, width * s.cells * element, src).reshape(width, s.cells, element)
                target = np.frombuffer(out, np.uint8, width * self.cells * element, dst).reshape(width, self.cells, element)
                target[:, at : at + take] = values[:, :take] if pick is None else values[:, pick]
        self.filled += take

    def result(self) -> bytearray:
        """The state of the cells added: all that were announced, or (a chunk found damaged on the way) those
        added before it, copied into a state of their own size."""
        if self.filled == self.cells:
            return self.out
        if not self.filled:
            raise ValueError("no cells were given")
        import struct

        import numpy as np

        n, total, out = self.filled, self.cells, self.out
        part = bytearray(out[:8])
        for s, (meta, k, v) in zip(self.layout.sections, self.places):
            part += struct.pack("<II", 1, n)
            part += out[meta : meta + n * s.cell_size]
            head = meta + total * s.cell_size
            part += out[head : head + 8]
            for (_, _, row), at in zip(s.k, k):
                part += out[at - 12 : at + n * row]
            for (_, _, *size), at in zip(s.v, v):
                if not s.v_trans:
                    part += out[at - 12 : at + n * size[0]]
                    continue
                element, width = size
                part += out[at - 12 : at]
                part += np.frombuffer(out, np.uint8, width * total * element, at).reshape(width, total, element)[:, :n].tobytes()
        return part
