"""Images in a prompt, through llama.cpp's multimodal library (libmtmd): a projector (an mmproj GGUF) loaded
beside an Engine's model, image bytes decoded and cut into the projector's image tokens, and those
evaluated into a sequence's KV.

In a prompt's token list an image is a run of negative ids derived from the sha256 of its bytes and the
projector's identity: the KV token lists, prefix reuse, and the prefix cache compare them as any tokens
(llama-server keys its cached image tokens by the image's hash the same way). Only this module evaluates
them: `prefill` puts a prompt into the KV up to the end of its last image, and the one decode loop
evaluates the text after it as usual.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import io
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import EngineError, Phrase, UsageError
from .llama import captured_llama_log, deferred_interrupt, default_threads, llama_cpp_module

# Where an image goes in rendered prompt text (llama.cpp's own default media marker).
MARKER = "<__media__>"
_KEEP_IMAGES = 32  # evaluable images kept (their preprocessed pixels): the prompts of the last few requests


@dataclass(frozen=True)
class Image:
    """An image as given: its encoded bytes (PNG, JPEG, GIF, BMP ...) and what an error calls it."""

    data: bytes = field(repr=False)
    name: str

    @cached_property
    def digest(self) -> bytes:
        return hashlib.sha256(self.data).digest()


class BadImage(UsageError):
    """Image bytes llama.cpp cannot read: `name` is the image as given, `reason` what is wrong with it."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name, self.reason = name, reason


def _is_webp(data: bytes) -> bool:
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def _readable(data: bytes) -> bytes:
    """The bytes llama.cpp's image reader (stb_image) is given: WebP, which it does not read, as PNG (its first
    frame) through Pillow where Pillow is installed; anything else as it is."""
    if not _is_webp(data):
        return data
    try:
        from PIL import Image as Picture
    except ImportError:
        return data
    try:
        with Picture.open(io.BytesIO(data)) as picture:
            out = io.BytesIO()
            picture.convert("RGB").save(out, "PNG")
            return out.getvalue()
    except Exception:  # noqa: BLE001 - a damaged WebP: refused below as unreadable, naming it
        return data


def _unreadable(data: bytes) -> str:
    if _is_webp(data):
        try:
            import PIL  # noqa: F401
        except ImportError:
            return ("WebP is read through Pillow, which is not installed (llama.cpp's own reader, stb_image, reads PNG, JPEG,"
                    " GIF, BMP, TGA, PNM): pip install pillow, or convert it to PNG")
        return "a WebP image that could not be read (damaged, or not a WebP after all)"
    if not data:
        return "an empty file, not an image"
    return "not an image llama.cpp can read (PNG, JPEG, GIF, BMP, TGA, PNM), or a damaged one"


@dataclass
class _ImageChunk:
    ids: tuple[int, ...]  # its run of negative ids in a prompt
    chunk: int  # an mtmd_input_chunk of this projector (owned)


class Projector:
    """A vision projector loaded for one engine's model (mtmd_init_from_file checks that its output width is
    the model's embedding width). Frees itself with the engine."""

    def __init__(self, engine, path: Path | str):
        ll = llama_cpp_module()
        mtmd_cpp = importlib.import_module("llama_cpp.mtmd_cpp")  # not `from llama_cpp import`: see lazy.submodule_first

        from . import llama as _llama

        self._m = mtmd_cpp
        # A server tokenizes a request's images in the request's thread while its scheduler thread evaluates
        # others': one projector call at a time (the kept chunks change under both).
        self._lock = threading.RLock()
        mtmd_cpp.mtmd_log_set(_llama._log_callback, ctypes.c_void_p(0))  # its chatter goes where llama.cpp's does
        mtmd_cpp.mtmd_helper_log_set(_llama._log_callback, ctypes.c_void_p(0))
        self.engine = engine
        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(Phrase("no such projector file: {path}: check {mmproj}", path=self.path))
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = bool(engine.devices) and engine.gpu_layers != 0
        params.n_threads = engine.options.n_threads or default_threads()
        params.print_timings = False
        params.warmup = False  # the first image pays for the graph, not every load
        with captured_llama_log() as log, deferred_interrupt():
            self.ctx = mtmd_cpp.mtmd_init_from_file(str(self.path).encode(), engine.model, params)
        if not self.ctx:
            said = [line for line in log if "error" in line.lower() or "failed" in line.lower()]
            # one line: llama.cpp's last complaint, without its function name ("mtmd_init_from_file: error: ")
            why = "; ".join(part.strip() for part in said[-1].splitlines() if part.strip()) if said else "see LOCALRUN_LLAMA_LOG=1"
            why = re.sub(r"^\w+: (error: )?", "", why)
            raise EngineError(f"llama.cpp could not load the projector {self.path} for {engine.path.name}: {why}")
        if not mtmd_cpp.mtmd_support_vision(self.ctx):
            self.close()
            raise EngineError(f"{self.path} has no vision encoder (an audio projector?): images need a vision projector")
        if mtmd_cpp.mtmd_decode_use_mrope(self.ctx):
            # M-RoPE (Qwen2-VL and later) gives an image fewer positions than tokens: the KV token lists here
            # assume one position per token.
            self.close()
            raise EngineError(f"{self.path} is a projector with M-RoPE positions (Qwen-VL family), which localrun does not evaluate yet")
        stat = self.path.stat()
        # Image ids depend on the projector too: the prefix cache outlives a run, and another projector
        # makes other embeddings of the same image.
        self._key = hashlib.sha256(f"{self.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).digest()
        self._chunks: OrderedDict[int, _ImageChunk] = OrderedDict()  # by the first id of the run
        self.encoded = 0  # images encoded (run through the vision tower) since load
        self._ll = ll

    # -- images to ids ------------------------------------------------------------------------

    def _bitmap(self, image: Image):
        m = self._m
        data = _readable(image.data)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if data else (ctypes.c_uint8 * 1)()
        with deferred_interrupt():
            bitmap = m.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False) if data else None
        if not bitmap:
            raise BadImage(image.name, _unreadable(image.data))
        if m.mtmd_bitmap_is_audio(bitmap):
            m.mtmd_bitmap_free(bitmap)
            raise BadImage(image.name, "an audio file, not an image")
        return bitmap

    def image_tokens(self, image: Image) -> list[int]:
        """The image's place in a prompt: the projector's text tokens around it (where it has any) and a run
        of negative ids for each of its image chunks, kept evaluable (the last _KEEP_IMAGES images)."""
        with self._lock:
            return self._image_tokens(image)

    def _image_tokens(self, image: Image) -> list[int]:
        m = self._m
        bitmap = self._bitmap(image)
        chunks = m.mtmd_input_chunks_init()
        try:
            text = m.mtmd_input_text()
            text.text = MARKER.encode()
            text.text_len = len(text.text)
            text.add_special, text.parse_special = False, True
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            with deferred_interrupt():
                rc = m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:  # 2: preprocessing failed (an image the projector cannot take)
                raise BadImage(image.name, f"the projector could not preprocess it (mtmd_tokenize code {rc})")
            out: list[int] = []
            for index in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, index)
                kind = m.mtmd_input_chunk_get_type(chunk)
                if kind == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ptr = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    out.extend(ptr[: n.value])
                elif kind == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    out.extend(self._keep(image, index, chunk))
                else:
                    raise BadImage(image.name, "the projector made audio of it, not an image")
            return out
        finally:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)

    def _keep(self, image: Image, index: int, chunk) -> tuple[int, ...]:
        m = self._m
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        seed = hashlib.sha256(self._key + image.digest + struct.pack("<I", index)).digest()
        words = struct.unpack("<8I", seed)
        ids = tuple(-1 - (words[i % 8] & 0x7FFFFFFF) for i in range(n))  # int32, never a vocabulary id
        known = self._chunks.get(ids[0])
        if known is not None and known.ids == ids:
            self._chunks.move_to_end(ids[0])
            return ids
        self._chunks[ids[0]] = _ImageChunk(ids, m.mtmd_input_chunk_copy(chunk))
        while len(self._chunks) > _KEEP_IMAGES:
            _, old = self._chunks.popitem(last=False)
            m.mtmd_input_chunk_free(old.chunk)
        return ids

    def tokenize(self, text: str, images: Sequence[Image]) -> list[int]:
        """The prompt tokens of `text` with one MARKER per image, in order: each piece of text tokenized as
        the engine tokenizes a prompt (special tokens parsed; BOS before the first), each image as
        image_tokens gives it. A text that ends with an image is refused: the last prompt token's logits
        are the ones sampled from, and an image has none."""
        pieces = text.split(MARKER)
        if len(pieces) - 1 != len(images):
            raise UsageError(f"the prompt has {len(pieces) - 1} image markers ({MARKER}) for {len(images)} images:"
                             f" leave {MARKER} out of the text")
        engine = self.engine
        tokens = engine.tokenize(pieces[0], add_special=True, parse_special=True)
        for image, piece in zip(images, pieces[1:]):
            tokens.extend(self.image_tokens(image))
            if piece:
                tokens.extend(engine.tokenize(piece, add_special=False, parse_special=True))
        if tokens and tokens[-1] < 0:
            raise UsageError("the prompt ends with an image: add text after it")
        return tokens

    # -- evaluation ----------------------------------------------------------------------------

    def check(self, tokens: Sequence[int]) -> None:
        """Refuse, before any work, a prompt whose images cannot be evaluated: one no longer held (see
        _KEEP_IMAGES), or one decoded in a single batch larger than the context's (see _fits)."""
        at = 0
        while at < len(tokens):
            if tokens[at] >= 0:
                at += 1
                continue
            with self._lock:
                known = self._known(tokens, at)
                self._fits(known)
            at += len(known.ids)

    def _fits(self, known: "_ImageChunk") -> None:
        engine = self.engine
        room = min(engine.n_batch, engine.options.n_ubatch)
        if len(known.ids) > room and self._m.mtmd_decode_use_non_causal(self.ctx, known.chunk):
            # its tokens attend to each other both ways: one batch, or llama.cpp aborts the process
            raise UsageError(Phrase("this projector's images are {n} tokens, decoded in one batch: raise {batch} to {n} or more",
                                    n=len(known.ids)))

    def _known(self, tokens: Sequence[int], at: int) -> "_ImageChunk":
        known = self._chunks.get(tokens[at])
        if known is None or tuple(tokens[at : at + len(known.ids)]) != known.ids:
            raise EngineError("an image of this prompt is no longer held by the projector: send the request again")
        return known

    def evaluate(self, seq: int, tokens: Sequence[int], at: int) -> int:
        """Evaluate the image whose tokens start at `tokens[at]` into sequence `seq`'s KV (after what it holds);
        returns where its tokens end. The prefill of the decode loop calls it as it reaches an image
        (engine.loop.Prefill)."""
        m, engine = self._m, self.engine
        kv = engine.kv
        n_past = len(kv.tokens[seq])
        with self._lock:
            known = self._known(tokens, at)
            self._fits(known)
            new_n_past = self._ll.llama_pos(0)
            with deferred_interrupt():
                rc = m.mtmd_helper_eval_chunk_single(self.ctx, engine.ctx, known.chunk, n_past, seq, engine.n_batch, False,
                                                     ctypes.byref(new_n_past))
            if rc != 0:
                self._ll.llama_memory_seq_rm(kv.memory, seq, n_past, -1)
                raise EngineError(Phrase("llama.cpp could not evaluate an image of {n} tokens (code {rc}): try a larger {batch}"
                                         " or {ctx}", n=len(known.ids), rc=rc))
            self.encoded += 1
            kv.tokens[seq].extend(known.ids)
            kv.made_with[seq] = kv.current  # (under the LoRA scales the context has now: the caller set them)
            self._chunks.move_to_end(known.ids[0])
            return at + len(known.ids)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        m = getattr(self, "_m", None)
        if m is None:
            return
        with self._lock:
            self._close(m)

    def _close(self, m) -> None:
        for entry in getattr(self, "_chunks", {}).values():
            m.mtmd_input_chunk_free(entry.chunk)
        self._chunks = OrderedDict()
        if getattr(self, "ctx", None):
            with deferred_interrupt():
                m.mtmd_free(self.ctx)
            self.ctx = None
