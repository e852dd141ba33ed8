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
_BLOCK = 64


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

    def __init__(self, ctx, n_seq: int):
        self._ll = llama_cpp_module()
        self.ctx = ctx
        self.memory = self._ll.llama_get_memory(ctx)
        self.n_seq = n_seq
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
        recurrent model): then the whole sequence goes."""
        if self._ll.llama_memory_seq_rm(self.memory, seq, n_keep, -1):
            del self.tokens[seq][n_keep:]
            return True
        self.clear(seq if self.n_seq > 1 else None)
        return False

    def reuse(self, seq: int, prompt: Sequence[int]) -> int:
        """Keep the longest prefix `seq` shares with `prompt` and drop the rest; returns how many tokens were
        kept. The prompt's last token is never kept: its logits are the ones to sample from."""
        keep = min(common_prefix(self.tokens[seq], prompt), len(prompt) - 1)
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
        if donor is None:
            return self.reuse(seq, prompt)
        self.copy(donor, seq)
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

    def _single_sequence(self) -> None:
        if self.n_seq != 1:
            raise SessionError(f"sessions need a single-sequence context; this one has {self.n_seq} sequences")

    def state_bytes(self) -> bytearray:
        """The KV state of this context's one sequence, with a sliding-window model's full window history.

        llama.cpp's per-sequence state (seq_id 0) keeps only the last window of the SWA layers, so a restored
        gemma-3 state could be extended but not cut back to a shorter common prefix without silently wrong
        output. The state of all sequences (-1) of a single-sequence context is sequence 0's, with its whole
        history (the engine keeps it with swa_full)."""
        self._single_sequence()
        ll = self._ll
        size = ll.llama_state_seq_get_size(self.ctx, ALL_SEQUENCES)
        data = bytearray(size)
        written = ll.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, ALL_SEQUENCES)
        if written != size:
            raise EngineError(f"llama.cpp wrote {written} of {size} bytes of KV state: the state was not saved")
        return data

    def restore(self, data: bytearray, tokens: Sequence[int]) -> bool:
        """Replace the cache with `data` (from state_bytes) holding `tokens`. On failure the cache is left
        empty and False is returned."""
        self._single_sequence()
        ll = self._ll
        self.clear()
        if not data:
            return False
        read = ll.llama_state_seq_set_data(self.ctx, (ctypes.c_uint8 * len(data)).from_buffer(data), len(data), ALL_SEQUENCES)
        # The cells must be exactly positions 0..len(tokens)-1, or the token list would lie about the cache.
        if read == 0 or ll.llama_memory_seq_pos_max(self.memory, 0) != len(tokens) - 1:
            self.clear()
            return False
        self.tokens[0] = list(tokens)
        return True
