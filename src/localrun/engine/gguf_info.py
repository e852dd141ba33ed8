"""Read and validate a GGUF file's header before llama.cpp ever sees it; estimate the memory a model needs.

The header is parsed here rather than with `gguf.GGUFReader`: the reader builds a numpy view per
array element, which takes seconds on a 262k-token vocabulary, and it trusts the tensor table, so a
truncated download fails deep inside numpy. This parser walks the header once, skips large arrays,
bounds-checks every read, and checks that the file is long enough for every tensor's data. The
`gguf` package still supplies the format's constants: value types, tensor types and their block
sizes, file-type names and the architectures llama.cpp knows.
"""

from __future__ import annotations

import mmap
import re
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .llama import llama_cpp_module

llama_cpp_module()  # before gguf imports numpy: see llama_cpp_module (whoever reads a GGUF gets the order right)

from ..lazy import submodule_first  # noqa: E402

gguf = submodule_first("gguf", "constants")  # its tables, not its reader and writer (numpy: 0.13 s on every start)
GGMLQuantizationType, GGUFValueType = gguf.GGMLQuantizationType, gguf.GGUFValueType

from ..errors import InvalidModelFile, UsageError

SUPPORTED_VERSIONS = (2, 3)
KNOWN_ARCHITECTURES = frozenset(gguf.MODEL_ARCH_NAMES.values())

# The cache types llama.cpp accepts for --cache-type-k/-v (common/arg.cpp).
KV_CACHE_TYPES = {
    name.lower(): GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1")
}

# llama.cpp rounds the context, and the sliding-window cache, up to a multiple of this.
_CTX_PAD = 256
# llama-cpp-python's default micro-batch; the sliding-window cache holds window + one micro-batch.
DEFAULT_N_UBATCH = 512

# Sliding-window layout llama.cpp assumes when the file has a window but no
# `{arch}.attention.sliding_window_pattern` (src/models/*.cpp: load_swa_pattern(ml, n, dense_first)).
# With a period n, layer il uses the window unless il % n == n - 1 (or il % n == 0 when dense_first).
_DEFAULT_SWA_PATTERN: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "gpt-oss": (2, False),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "olmo2": (4, False),
    "plamo3": (8, False),
    "afmoe": (4, False),
}
# Gemma 2 files often omit the window; llama.cpp then uses this.
_DEFAULT_SWA_WINDOW = {"gemma2": 4096}

_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp keeps per-layer values in arrays of this size
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME = 64  # GGML_MAX_NAME, including the terminating NUL
_KEEP_ARRAY = 65536  # numeric arrays up to this length are kept (per-layer values); longer ones are counted

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class ArraySummary:
    """A metadata array too long to keep (the vocabulary, the merges): its element type and length."""

    element_type: str
    count: int


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF model file says about itself; sizes and counts cover all shards of a split model."""

    path: Path
    gguf_version: int
    architecture: str
    name: str | None
    quant: str  # "Q4_1", "Q4_K_M": from general.file_type, else the dominant tensor type
    n_params: int
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int  # the largest per-layer value; see kv_heads
    kv_heads: tuple[int, ...]  # per layer (0 for a layer without attention)
    head_dim_k: int
    head_dim_v: int
    context_length: int
    sliding_window: int | None  # tokens a sliding-window layer attends to
    swa_pattern: int | None  # period of the sliding/global layout (gemma3: 6), when it is periodic
    swa_layers: tuple[bool, ...]  # per layer, True where it uses the window; () when unknown or none
    vocab_size: int | None
    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    file_size: int  # bytes on disk, all shards
    tensor_bytes: int  # bytes of tensor data, all shards: what loading the weights costs
    n_tensors: int
    n_split: int
    shards: tuple[Path, ...]
    head_dim_k_swa: int = 0  # 0: same as head_dim_k
    head_dim_v_swa: int = 0
    # Where the bytes are, for a placement plan (engine.rpc.placement): the input layer's (token embeddings,
    # kept on the CPU), each repeating layer's ("blk.N."), and the output layer's (the rest).
    input_bytes: int = field(default=0, compare=False)
    layer_bytes: tuple[int, ...] = field(default=(), compare=False)
    output_bytes: int = field(default=0, compare=False)
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def head_dim(self) -> int:
        return self.head_dim_k


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    offset: int  # relative to the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def n_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.ggml_type]
        return self.n_elements // block * size


@dataclass
class _Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[_Tensor]
    data_start: int
    file_size: int

    @property
    def data_end(self) -> int:
        return max((self.data_start + t.offset + t.n_bytes for t in self.tensors), default=self.data_start)


class _Corrupt(Exception):
    """A header that does not parse; read_info turns it into InvalidModelFile."""


class _Truncated(Exception):
    """A read ran past the end of the file."""


class _Cursor:
    def __init__(self, buf: Any, size: int, order: str):
        self.buf, self.size, self.order, self.pos = buf, size, order, 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        except struct.error as exc:
            raise _Truncated from exc
        self.pos += struct.calcsize(fmt)
        return value

    def skip_string(self) -> int:
        """Step over a length-prefixed string; return where it started (after the length)."""
        n = self.unpack("Q")
        start, self.pos = self.pos, self.pos + n
        if self.pos > self.size:
            raise _Truncated
        return start

    def string(self) -> str:
        start = self.skip_string()
        return self.buf[start : self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        vtype = _value_type(vtype)
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array()
        return self.unpack(_SCALAR_FORMATS[vtype])

    def array(self) -> Any:
        etype = _value_type(self.unpack("I"))
        count = self.unpack("Q")
        if etype in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[etype]
            nbytes = count * struct.calcsize(fmt)
            if self.pos + nbytes > self.size:
                raise _Truncated
            if count > _KEEP_ARRAY:
                self.pos += nbytes
                return ArraySummary(etype.name, count)
            values = struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.pos)
            self.pos += nbytes
            return values
        if count * 8 > self.size - self.pos:  # every element needs at least its 8-byte length
            raise _Truncated
        if etype == GGUFValueType.STRING:
            if count <= 256:
                return tuple(self.string() for _ in range(count))
            self.pos = _skip_strings(self.buf, self.pos, count, self.order)
            if self.pos > self.size:
                raise _Truncated
            return ArraySummary(etype.name, count)
        items = [self.array() for _ in range(count)]  # arrays of arrays
        return tuple(items) if count <= 256 else ArraySummary(etype.name, count)


def _skip_strings(buf: Any, pos: int, count: int, order: str) -> int:
    """Where `count` length-prefixed strings from `pos` end: the loop over a vocabulary (hundreds of thousands
    of tokens and merges) kept to one unpack per string (through _Cursor.skip_string it took 0.16 s a parse of
    SmolLM2's 49k tokens and merges, more for larger vocabularies). A length running past the end makes the
    next unpack fail (_Truncated); the caller checks the last."""
    length = struct.Struct(order + "Q").unpack_from
    try:
        for _ in range(count):
            pos += 8 + length(buf, pos)[0]
    except struct.error as exc:
        raise _Truncated from exc
    return pos


def _value_type(raw: int) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise _Corrupt(f"unknown value type {raw}") from None


def _parse_header(buf: Any, size: int) -> _Header:
    """Parse version, metadata and the tensor table after the magic; raise _Corrupt or _Truncated."""
    raw_version = struct.unpack_from("<I", buf, 4)[0]
    # A big-endian file stores the version byte-swapped; gguf-py detects it the same way.
    order = ">" if raw_version & 0xFFFF == 0 else "<"
    cur = _Cursor(buf, size, order)
    cur.pos = 4
    version = cur.unpack("I")
    if version not in SUPPORTED_VERSIONS:
        raise _Corrupt(f"unsupported GGUF version {version}, expected one of {SUPPORTED_VERSIONS}")
    n_tensors = cur.unpack("Q")
    n_kv = cur.unpack("Q")
    # Each key/value needs at least 8 + 4 + 1 bytes and each tensor entry at least 8 + 4 + 8 + 4 + 8.
    if n_kv * 13 + n_tensors * 32 > size - cur.pos:
        raise _Truncated

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(cur.unpack("I"))
        if key in metadata:
            raise _Corrupt(f"duplicate key {key!r}")
        metadata[key] = value

    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Corrupt(f"bad general.alignment {alignment!r}")

    tensors: list[_Tensor] = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string()
        if len(name.encode()) >= _MAX_NAME:
            raise _Corrupt(f"tensor name too long: {name[:40]!r}...")
        if name in seen:
            raise _Corrupt(f"duplicate tensor {name!r}")
        seen.add(name)
        n_dims = cur.unpack("I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cur.unpack("Q") for _ in range(n_dims))
        raw_type = cur.unpack("I")
        try:
            ggml_type = GGMLQuantizationType(raw_type)
            block = gguf.GGML_QUANT_SIZES[ggml_type][0]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor {name!r} has unknown type {raw_type}") from None
        offset = cur.unpack("Q")
        tensor = _Tensor(name, shape, ggml_type, offset)
        if shape[0] % block or tensor.n_elements >= 1 << 63:
            raise _Corrupt(f"tensor {name!r} has a bad shape {shape} for {ggml_type.name}")
        if offset % alignment:
            raise _Corrupt(f"tensor {name!r} is misaligned")
        tensors.append(tensor)

    data_start = -(-cur.pos // alignment) * alignment
    return _Header(version, metadata, tensors, data_start, size)


def _read_header(path: Path) -> _Header:
    """Open, parse and size-check one GGUF file; every failure becomes a one-line InvalidModelFile. A file parsed
    before is not parsed again while it is unchanged (read_info's rule): one load reads a model's header three
    times (read_info, then the engine's repacked weights twice), 15 ms each for SmolLM2's vocabulary."""
    state = _file_state(path)
    known = _HEADERS.get(path)
    if state is not None and known is not None and known[0] == state:
        return known[1]
    header = _parse_file(path)
    _keep(_HEADERS, 4, path, state, header)  # (4: a header holds its per-token arrays, a few models' worth)
    return header


_HEADERS: dict[Path, tuple] = {}  # _read_header's headers: path -> (its state, the header); callers only read them


def _parse_file(path: Path) -> _Header:
    if not path.exists():
        raise InvalidModelFile(f"{path}: no such file: check the path, or pull the model again")
    if path.is_dir():
        raise InvalidModelFile(f"{path}: is a directory, not a GGUF file: pass the .gguf file itself")
    if not path.is_file():
        raise InvalidModelFile(f"{path}: not a regular file: pass a .gguf model file")
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise InvalidModelFile(f"{path}: empty file, not a GGUF model: delete it and pull again")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                head = buf[:8]
                if head[:4] != b"GGUF":
                    raise InvalidModelFile(
                        f"{path}: not a GGUF file (starts with {head!r}): pass a .gguf model file, or delete it and pull again"
                    )
                if size < 24:
                    raise _Truncated
                header = _parse_header(buf, size)
    except InvalidModelFile:
        raise
    except OSError as exc:
        raise InvalidModelFile(f"{path}: cannot read ({exc.strerror or exc}): check the file and its permissions") from exc
    except _Truncated:
        raise InvalidModelFile(
            f"{path}: truncated GGUF file (it ends inside its header, after {size} bytes): delete it and pull again"
        ) from None
    except _Corrupt as exc:
        raise InvalidModelFile(f"{path}: corrupt GGUF header ({exc}): delete it and pull again") from None
    except (ValueError, IndexError, OverflowError, MemoryError, RecursionError, struct.error) as exc:
        raise InvalidModelFile(f"{path}: corrupt GGUF header ({type(exc).__name__}): delete it and pull again") from exc
    if header.data_end > size:
        raise InvalidModelFile(
            f"{path}: truncated GGUF file (expected {header.data_end} bytes, found {size}): delete it and pull again"
        )
    return header


def _shard_paths(path: Path, header: _Header) -> list[Path]:
    """All files of a split model, given its first shard; one-line errors for a wrong or missing shard."""
    count = header.metadata.get("split.count", 1)
    if not isinstance(count, int) or count < 1:
        raise InvalidModelFile(f"{path}: corrupt GGUF header (split.count = {count!r}): delete it and pull again")
    if count == 1:
        return [path]
    match = _SPLIT_NAME.match(path.name)
    number = header.metadata.get("split.no", 0)
    if number != 0:
        first = f"{match['prefix']}-00001-of-{count:05d}.gguf" if match else "the first shard"
        raise InvalidModelFile(f"{path}: is shard {number + 1} of {count}: pass {first} instead")
    if not match or int(match["no"]) != 1 or int(match["count"]) != count:
        raise InvalidModelFile(
            f"{path}: split.count says {count} shards, but the name does not end in -00001-of-{count:05d}.gguf: "
            "keep the shards' original names"
        )
    return [path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_info(path: Path | str) -> GGUFInfo:
    """Validate a GGUF model file (and its sibling shards) and summarise it, without reading tensor data.

    Raises InvalidModelFile with a one-line message naming the path for anything llama.cpp would
    choke on: not GGUF, truncated, corrupt header, unknown architecture, not a model, missing shard.
    A file read before is not parsed again while it and its shards are unchanged (their inode, size and
    modification time the same): one load asks for the summary more than once (the default context, then
    the engine), and a server for every request that names the model.
    """
    path = Path(path)
    state = _file_state(path)
    known = _READ.get(path)
    if state is not None and known is not None and known[0] == state and all(
            _file_state(shard) == seen for shard, seen in known[1]):
        return known[2]
    info = _read_info(path)
    _keep(_READ, 32, path, state, [(shard, _file_state(shard)) for shard in info.shards[1:]], info)
    return info


_READ: dict[Path, tuple] = {}  # read_info's summaries: path -> (its state, its shards' states, the summary)


def _keep(cache: dict, most: int, path: Path, state: tuple | None, *read) -> None:
    """Remember what was `read` of the file at `path` in `cache` (at most `most` files, then it starts again), keyed
    by its `state`, unless the file was written in the last 2 s: as git's index, a file written in the last moments
    could change again within the clock's tick and keep its time, so it is read again."""
    if state is not None and state[3] < time.time_ns() - 2_000_000_000:
        if len(cache) >= most:
            cache.clear()
        cache[path] = (state, *read)


def _file_state(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_info(path: Path) -> GGUFInfo:
    header = _read_header(path)
    meta = header.metadata
    shards = _shard_paths(path, header)
    headers = [header]
    for index, shard in enumerate(shards[1:], start=1):
        if not shard.exists():
            raise InvalidModelFile(f"{path}: shard {shard.name} ({index + 1} of {len(shards)}) is missing: pull the model again")
        sibling = _read_header(shard)
        if sibling.metadata.get("split.no") != index or sibling.metadata.get("split.count") != len(shards):
            raise InvalidModelFile(f"{shard}: is not shard {index + 1} of {len(shards)} of {path.name}: pull the model again")
        headers.append(sibling)
    tensors = [t for h in headers for t in h.tensors]
    expected_tensors = meta.get("split.tensors.count", len(tensors))
    if expected_tensors != len(tensors):
        raise InvalidModelFile(f"{path}: the shards hold {len(tensors)} tensors, expected {expected_tensors}: pull the model again")

    arch = _metadata_value(path, meta, "general.architecture", str)
    if arch not in KNOWN_ARCHITECTURES:
        raise InvalidModelFile(
            f"{path}: unknown model architecture {arch!r}: this llama.cpp cannot run it (upgrade localrun or pick another model)"
        )
    kind = meta.get("general.type", "model")
    if kind != "model":
        raise InvalidModelFile(f"{path}: is a GGUF {kind!r} file, not a model: pass the model's .gguf file")

    def key(template: str) -> str:
        return template.format(arch=arch)

    K = gguf.Keys
    n_layer = _metadata_value(path, meta, key(K.LLM.BLOCK_COUNT), int)
    if n_layer > _MAX_LAYERS:
        raise InvalidModelFile(f"{path}: {key(K.LLM.BLOCK_COUNT)} = {n_layer} exceeds llama.cpp's {_MAX_LAYERS} layers: pull the model again")
    n_embd = _metadata_value(path, meta, key(K.LLM.EMBEDDING_LENGTH), int)
    context_length = _metadata_value(path, meta, key(K.LLM.CONTEXT_LENGTH), int)
    heads = _per_layer(path, meta, key(K.Attention.HEAD_COUNT), n_layer, default=(0,) * n_layer)
    kv_heads = _per_layer(path, meta, key(K.Attention.HEAD_COUNT_KV), n_layer, default=heads)
    # As llama.cpp does: the head size comes from the first layer's head count unless given.
    n_head_first = heads[0] if heads else 0
    default_dim = n_embd // n_head_first if n_head_first else 0
    head_dim_k = _optional_int(path, meta, key(K.Attention.KEY_LENGTH), default_dim)
    head_dim_v = _optional_int(path, meta, key(K.Attention.VALUE_LENGTH), default_dim)
    window, pattern, swa_layers = _sliding_window(path, meta, arch, n_layer)

    tokens = meta.get(K.Tokenizer.LIST)
    vocab_size = tokens.count if isinstance(tokens, ArraySummary) else len(tokens) if isinstance(tokens, tuple) else None
    if vocab_size is None:
        vocab_size = _optional_int(path, meta, key(K.LLM.VOCAB_SIZE), 0) or None
    template = meta.get(K.Tokenizer.CHAT_TEMPLATE)
    name = meta.get(K.General.NAME)

    return GGUFInfo(
        path=path,
        gguf_version=header.version,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        quant=_quant_label(meta.get(K.General.FILE_TYPE), tensors),
        n_params=sum(t.n_elements for t in tensors),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=max(heads, default=0),
        n_kv_head=max(kv_heads, default=0),
        kv_heads=kv_heads,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        head_dim_k_swa=_optional_int(path, meta, key(K.Attention.KEY_LENGTH_SWA), 0),
        head_dim_v_swa=_optional_int(path, meta, key(K.Attention.VALUE_LENGTH_SWA), 0),
        context_length=context_length,
        sliding_window=window,
        swa_pattern=pattern,
        swa_layers=swa_layers,
        vocab_size=vocab_size,
        chat_template=template if isinstance(template, str) and template.strip() else None,
        bos_token_id=_optional_int(path, meta, K.Tokenizer.BOS_ID, None),
        eos_token_id=_optional_int(path, meta, K.Tokenizer.EOS_ID, None),
        file_size=sum(h.file_size for h in headers),
        tensor_bytes=sum(t.n_bytes for t in tensors),
        **_layer_bytes(tensors, n_layer),
        n_tensors=len(tensors),
        n_split=len(shards),
        shards=tuple(shards),
        metadata=meta,
    )


def _metadata_value(path: Path, meta: Mapping[str, Any], key: str, kind: type) -> Any:
    value = meta.get(key)
    if value is None:
        raise InvalidModelFile(f"{path}: GGUF metadata lacks {key}: not a complete model file, pull it again")
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value <= 0):
        raise InvalidModelFile(f"{path}: GGUF metadata {key} = {value!r} is invalid: pull the model again")
    return value


def _optional_int(path: Path, meta: Mapping[str, Any], key: str, default: Any) -> Any:
    value = meta.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidModelFile(f"{path}: GGUF metadata {key} = {value!r} is invalid: pull the model again")
    return value


def _per_layer(path: Path, meta: Mapping[str, Any], key: str, n_layer: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """A value llama.cpp reads as one number for all layers or an array with one per layer."""
    value = meta.get(key)
    if value is None:
        return default
    if isinstance(value, tuple) and len(value) == n_layer and all(isinstance(v, int) and v >= 0 for v in value):
        return tuple(int(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (value,) * n_layer
    raise InvalidModelFile(f"{path}: GGUF metadata {key} is invalid for {n_layer} layers: pull the model again")


def _sliding_window(
    path: Path, meta: Mapping[str, Any], arch: str, n_layer: int
) -> tuple[int | None, int | None, tuple[bool, ...]]:
    """(window, period, per-layer flags) as llama.cpp would set them up; flags are () when unknown or none."""
    window = _optional_int(path, meta, f"{arch}.attention.sliding_window", _DEFAULT_SWA_WINDOW.get(arch))
    if not window:
        return None, None, ()
    explicit = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(explicit, tuple):
        if len(explicit) != n_layer:
            raise InvalidModelFile(
                f"{path}: {arch}.attention.sliding_window_pattern does not have {n_layer} entries: pull the model again"
            )
        return window, None, tuple(bool(v) for v in explicit)
    period, dense_first = _DEFAULT_SWA_PATTERN.get(arch, (None, False))
    if explicit is not None:
        period = _optional_int(path, meta, f"{arch}.attention.sliding_window_pattern", None)
    if period is None:
        return window, None, ()
    if period == 0:  # llama.cpp: every layer uses the window
        return window, 0, (True,) * n_layer
    if dense_first:
        return window, period, tuple(il % period != 0 for il in range(n_layer))
    return window, period, tuple(il % period < period - 1 for il in range(n_layer))


def _layer_bytes(tensors: list[_Tensor], n_layer: int) -> dict[str, Any]:
    """The bytes of the input layer, of each repeating layer and of the output layer (llama.cpp's names:
    token_embd is the input; blk.N.* layer N; output and output_norm, and anything else, the output)."""
    layers = [0] * n_layer
    input_bytes = output_bytes = 0
    for t in tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < n_layer:
            layers[int(parts[1])] += t.n_bytes
        elif parts[0] in ("token_embd", "token_types", "position_embd"):
            input_bytes += t.n_bytes
        else:
            output_bytes += t.n_bytes
    if not any(t.name == "output.weight" for t in tensors):  # tied embeddings: llama.cpp copies them to the output layer
        output_bytes += sum(t.n_bytes for t in tensors if t.name == "token_embd.weight")
    return {"input_bytes": input_bytes, "layer_bytes": tuple(layers), "output_bytes": output_bytes}


def _quant_label(file_type: Any, tensors: list[_Tensor]) -> str:
    """general.file_type as llama.cpp names it ("Q4_K_M"); else the type holding most weight elements."""
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            name = gguf.LlamaFileType(file_type).name
        except ValueError:
            name = ""
        if name == "ALL_F32":
            return "F32"
        if name.startswith("MOSTLY_"):
            return name.removeprefix("MOSTLY_")
    weights = Counter()
    for t in tensors:
        if len(t.shape) >= 2:
            weights[t.ggml_type.name] += t.n_elements
    if not weights:
        weights.update(t.ggml_type.name for t in tensors)
    return weights.most_common(1)[0][0] if weights else "unknown"


def _kv_type_size(kv_type: str) -> tuple[int, int]:
    """(block size, bytes per block) for a cache type name such as "f16" or "q8_0"."""
    ggml_type = KV_CACHE_TYPES.get(str(kv_type).lower())
    if ggml_type is None:
        raise UsageError(f"unknown KV cache type {kv_type!r}: use one of {', '.join(KV_CACHE_TYPES)}")
    return gguf.GGML_QUANT_SIZES[ggml_type]


def _pad(n: int, to: int = _CTX_PAD) -> int:
    return -(-n // to) * to


def kv_cache_bytes(
    info: GGUFInfo,
    n_ctx: int,
    kv_type: str = "f16",
    *,
    swa_full: bool = True,
    n_ubatch: int = DEFAULT_N_UBATCH,
) -> int:
    """Bytes of K and V cache llama.cpp allocates for one sequence of `n_ctx` tokens.

    Per layer: n_ctx × n_kv_head × (key_length + value_length) × bytes per element — the familiar
    2 × n_layer × n_kv_head × head_dim × bytes × n_ctx when keys and values match. Like llama.cpp,
    n_ctx is rounded up to a multiple of 256 and n_ctx=0 means the model's training context.
    swa_full=True (llama-cpp-python's default) gives sliding-window layers the full context;
    swa_full=False gives them window + n_ubatch cells (rounded to 256), as llama.cpp then does.
    """
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 0:
        raise UsageError(f"context size must be a whole number of tokens >= 0, got {n_ctx!r}")
    if not isinstance(n_ubatch, int) or n_ubatch < 1:
        raise UsageError(f"micro-batch size must be >= 1, got {n_ubatch!r}")
    block, block_bytes = _kv_type_size(kv_type)
    cells = _pad(n_ctx or info.context_length)
    swa_cells = cells
    if not swa_full and info.sliding_window:
        swa_cells = _pad(min(cells, info.sliding_window + n_ubatch))
    swa_layers = info.swa_layers or (False,) * info.n_layer
    total = 0
    for n_kv, is_swa in zip(info.kv_heads, swa_layers):
        dim_k = (info.head_dim_k_swa or info.head_dim_k) if is_swa else info.head_dim_k
        dim_v = (info.head_dim_v_swa or info.head_dim_v) if is_swa else info.head_dim_v
        row = n_kv * dim_k + n_kv * dim_v
        if (n_kv * dim_k) % block or (n_kv * dim_v) % block:
            raise UsageError(
                f"KV cache type {kv_type!r} needs rows divisible by {block}; {info.architecture} has "
                f"{n_kv} heads of {dim_k}/{dim_v}: use f16"
            )
        total += row // block * block_bytes * (swa_cells if is_swa else cells)
    return total


def memory_estimate(info: GGUFInfo, n_ctx: int, kv_type: str = "f16", *, swa_full: bool = True) -> dict[str, int]:
    """Weights plus KV cache, in bytes.

    Not included: llama.cpp's compute buffer, which grows with vocabulary x micro-batch
    (about 0.5 GiB for gemma-3's 262k vocabulary at n_ubatch=512, 0.1 GiB for SmolLM2).
    """
    kv = kv_cache_bytes(info, n_ctx, kv_type, swa_full=swa_full)
    return {"weights_bytes": info.tensor_bytes, "kv_bytes": kv, "total_bytes": info.tensor_bytes + kv}
