"""Embeddings: texts to pooled, L2-normalised vectors on a model loaded as an embeddings context
(loader.load(embeddings=True)), for `localrun embed`, /v1/embeddings and Ollama's /api/embed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ..errors import ContextOverflow, UsageError
from .loader import Loaded


@dataclass
class Embeddings:
    vectors: list[list[float]]
    prompt_tokens: int  # tokens read, all texts
    seconds: float


def embed(loaded: Loaded, texts: list, *, truncate: bool = True, dimensions: Optional[int] = None) -> Embeddings:
    """One vector per text (a string, or token ids) (the model's n_embd values, unit length). A text longer than the context is cut
    to fit when `truncate` (as Ollama does by default), else ContextOverflow names it."""
    engine = loaded.engine
    if dimensions is not None and dimensions != engine.n_embd:
        raise UsageError(f"dimensions {dimensions}: this model makes {engine.n_embd}-dimensional embeddings only")
    t0 = time.perf_counter()
    lists = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            tokens = engine.tokenize(text, add_special=True, parse_special=False)
        else:  # token ids, as OpenAI's API takes them
            tokens = list(text)
            bad = [t for t in tokens if not 0 <= t < engine.n_vocab]
            if bad:
                raise UsageError(f"token id {bad[0]} is out of range: this model's ids run 0..{engine.n_vocab - 1}")
        if len(tokens) > engine.n_ctx:
            if not truncate:
                raise ContextOverflow(f"text {i} is {len(tokens)} tokens but the context holds {engine.n_ctx}:"
                                      " shorten it, raise the context, or let it be truncated", len(tokens), engine.n_ctx)
            tokens = tokens[: engine.n_ctx]
        lists.append(tokens)
    vectors = engine.embed(lists)
    return Embeddings(vectors, sum(len(t) for t in lists), time.perf_counter() - t0)


def npy_bytes(vectors: list[list[float]]) -> bytes:
    """The vectors as a NumPy .npy file (float32, one row per text), written without numpy (the layers above
    the engine do not import it): format 1.0, a header dict, then the little-endian data."""
    import struct

    rows, cols = len(vectors), len(vectors[0]) if vectors else 0
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"  # the data starts on a multiple of 64 bytes
    data = struct.pack(f"<{rows * cols}f", *(x for v in vectors for x in v))
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + data
