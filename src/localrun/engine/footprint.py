"""What a loaded model holds, as llama.cpp allocates it: the mapped weights, the repacked copy of them, the KV
cache and the compute buffers (`footprint`), from the GGUF file alone, before anything loads.

The repacked copy is what llama.cpp's CPU backend makes to lay weights out for its matrix kernels (the
CPU_REPACK buffer): counted from the tensor table, by the rules of ggml-cpu/repack.cpp.

When the CPU is the only device (no GPU, no RPC worker: with a GPU, CPU layers go to its pinned host buffer
first; with RPC, localrun turns extra buffers off), each weight a matrix multiplication reads is placed in
CPU_REPACK if ggml has a kernel for its type on this CPU and its row count is a multiple of the kernel's
interleave. The repacked buffer is as large as the tensor (ggml_nbytes) and comes on top of the mapped file.
llama.cpp reads a repacked weight's pages of the file once, to make the copy, and leaves them mapped; the
engine gives them back after the load (release_repacked_pages: a clean page of a file, read again from the
page cache should anything touch it), so the mapped weights held are those of the other tensors. The token
embedding is read by GET_ROWS (not repacked, its pages kept), but where the model ties its output to it
llama.cpp loads it a second time as the output matrix, and that copy is repacked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

# ggml type -> [(CPU features all needed, rows multiple)], in the order ggml_repack_get_optimal_repack_type tries
_KERNELS: dict[str, list[tuple[tuple[str, ...], int]]] = {
    "Q4_0": [(("AVX2",), 8), (("NEON", "MATMUL_INT8"), 4), (("NEON", "DOTPROD"), 4)],
    "Q4_K": [(("AVX2",), 8), (("NEON", "MATMUL_INT8"), 8), (("NEON", "DOTPROD"), 8)],
    "Q2_K": [(("AVX512",), 8)],
    "Q5_K": [(("NEON", "MATMUL_INT8"), 8), (("NEON", "DOTPROD"), 8)],
    "Q6_K": [(("NEON", "MATMUL_INT8"), 8), (("NEON", "DOTPROD"), 8)],
    "IQ4_NL": [(("AVX2",), 8), (("NEON", "DOTPROD"), 4)],
    "MXFP4": [(("AVX2",), 8), (("NEON", "DOTPROD"), 4)],
    "Q8_0": [(("NEON", "MATMUL_INT8"), 4), (("NEON", "DOTPROD"), 4)],
    "Q1_0": [(("NEON", "MATMUL_INT8"), 4), (("NEON", "DOTPROD"), 4)],
}
# weights that are not a matrix multiplication's first operand (norms, biases, lookups)
_NOT_MATMUL = re.compile(r"(^token_embd\.|^position_embd\.|^token_types\.|norm|\.bias$|rope_freqs|^rope_)")


def cpu_features() -> frozenset[str]:
    """The CPU features llama.cpp's CPU backend was built for and found ('AVX2', 'NEON', ...), and 'REPACK'
    when it has the repacking buffer at all (llama_print_system_info)."""
    from .llama import build_system_info

    return frozenset(name for name, on in re.findall(r"([A-Z0-9_]+) = (\d)", build_system_info()) if on == "1")


def repacked_bytes(path: Path | str, features: Optional[frozenset[str]] = None) -> int:
    """Bytes llama.cpp puts in CPU_REPACK for this model on this CPU (0 where it repacks nothing)."""
    features = cpu_features() if features is None else features
    if "REPACK" not in features:
        return 0
    shards = shard_headers(path)
    tensors = [t for _, h in shards for t in h.tensors]
    total = sum(t.n_bytes for t in tensors if not _NOT_MATMUL.search(t.name) and _repacks(t, features))
    if not any(t.name == "output.weight" for t in tensors):  # tied embeddings: the output's own (repacked) copy
        total += sum(t.n_bytes for t in tensors if t.name == "token_embd.weight" and _repacks(t, features))
    return total


def shard_headers(path: Path | str) -> list:
    """(file, header) of each file of a model, first shard first."""
    from .gguf_info import _read_header, _shard_paths

    first = _read_header(Path(path))
    files = _shard_paths(Path(path), first)
    return [(files[0], first)] + [(p, _read_header(p)) for p in files[1:]]


def repacked_spans(path: Path | str, features: Optional[frozenset[str]] = None) -> list[tuple[Path, int, int]]:
    """(file, start, end): the byte ranges of a model's files that hold only weights llama.cpp copies into
    CPU_REPACK (runs of such tensors side by side, in file order), whose mapped pages it reads once, at load."""
    features = cpu_features() if features is None else features
    if "REPACK" not in features:
        return []
    spans: list[tuple[Path, int, int]] = []
    for file, header in shard_headers(path):
        start = end = None
        for t in sorted(header.tensors, key=lambda t: t.offset):
            begin, stop = header.data_start + t.offset, header.data_start + t.offset + t.n_bytes
            if _NOT_MATMUL.search(t.name) or not _repacks(t, features):
                if start is not None:
                    spans.append((file, start, end))
                start = None
            elif start is None:
                start, end = begin, stop
            else:
                end = stop  # (what lies between two tensors is alignment padding, read with neither)
        if start is not None:
            spans.append((file, start, end))
    return spans


def released_bytes(path: Path | str, features: Optional[frozenset[str]] = None) -> int:
    """What release_repacked_pages gives back of a model's mapped file: its repacked spans, whole pages only."""
    page = _page()
    return sum(max(0, (end // page - (start + page - 1) // page) * page) for _, start, end in repacked_spans(path, features))


def mapped_regions(files: list[Path]) -> set[tuple[int, int, int, str]]:
    """(start, end, file offset, file) of each region of this process's memory mapping one of `files`
    (/proc/self/maps; none where there is no /proc): what a load maps is the regions new after it."""
    import os

    wanted = {os.path.realpath(f) for f in files}
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and parts[5] in wanted:
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    found.add((start, end, int(parts[2], 16), parts[5]))
    except OSError:
        pass
    return found


def release_repacked_pages(spans: list[tuple[Path, int, int]], regions: set[tuple[int, int, int, str]]) -> int:
    """Give back the pages of `regions` (a model's mapped files) that hold only repacked weights: llama.cpp read
    them once, to make its repacked copy, and never again, but left them mapped, so the process held those
    weights twice (Qwen2.5-Coder-1.5B Q4_K_M: 597 MiB more than llama.cpp uses). MADV_DONTNEED on a read-only
    file mapping drops the pages from the process, not from the page cache: anything that touched them again
    would read the file's bytes as before. Returns the bytes given back (0 where madvise is not there)."""
    import ctypes
    import os

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    page, released = _page(), 0
    for file, start, end in spans:
        for m_start, m_end, offset, name in regions:
            if name != os.path.realpath(file):
                continue
            lo, hi = max(start, offset), min(end, offset + m_end - m_start)  # the span's part in this region
            first, last = m_start + lo - offset, m_start + hi - offset
            first, last = (first + page - 1) // page * page, last // page * page  # whole pages only
            if last > first and madvise(first, last - first, 4) == 0:  # MADV_DONTNEED
                released += last - first
    return released


def _page() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _repacks(tensor, features: frozenset[str]) -> bool:
    if len(tensor.shape) not in (2, 3):  # 2: MUL_MAT, 3: MUL_MAT_ID (experts)
        return False
    rows = tensor.shape[1]
    for needs, multiple in _KERNELS.get(tensor.ggml_type.name, []):
        if all(f in features for f in needs) and rows % multiple == 0:
            return True
    return False


def repack_allowed() -> bool:
    """LOCALRUN_REPACK=0 keeps the weights in plain CPU buffers (llama.cpp's --no-repack): slower matrix
    kernels, but the ones an RPC worker's CPU runs, so a model alone computes as one split across workers."""
    import os

    return os.environ.get("LOCALRUN_REPACK", "1").strip().lower() not in ("0", "off", "false", "no")


def repacks_here(rpc: bool = False) -> bool:
    """Whether llama.cpp repacks weights in this process: the CPU is the only device (no GPU, whose pinned host
    buffer comes first; no RPC worker, for which localrun turns extra buffers off) and repacking is allowed."""
    from .llama import local_gpus

    return not rpc and not local_gpus() and repack_allowed()


def compute_bytes(info, n_ctx: int, n_ubatch: int = 512, n_outputs: int = 1, n_seq: int = 1) -> int:
    """llama.cpp's compute buffers for a micro-batch of `n_ubatch` tokens, approximated by what their peak holds:
    three feed-forward-wide and three embedding-wide activations per token, an f16 attention mask (a sequence's
    context x n_ubatch, `n_seq` sequences in their own KV streams; two with sliding-window layers), and the logits of `n_outputs` rows, held twice (the graph's
    result and the output buffer). Within a few per cent of llama.cpp's log for SmolLM2, gemma-3 and Qwen2.5."""
    n_ff = _feed_forward(info)
    masks = 2 if info.sliding_window else 1
    activations = n_ubatch * 4 * 3 * (n_ff + info.n_embd)
    mask = masks * (n_ctx // max(1, n_seq)) * _pad(n_ubatch, 64) * 2
    logits = 2 * n_outputs * (info.vocab_size or 0) * 4
    return activations + mask + logits


def footprint(info, n_ctx: int, kv_type: str = "f16", *, n_ubatch: int = 512, n_outputs: int = 1, n_seq: int = 1,
              repack: bool = True, swa_full: bool = True) -> dict[str, int]:
    """Bytes a model loaded with this context holds, by what holds them: the weights (the file's tensors,
    mapped, less those of the weights repacked, whose pages the engine gives back), llama.cpp's repacked
    copy of some of them (`repack`: see repacks_here), the KV cache and the compute buffers; and their total."""
    from .gguf_info import kv_cache_bytes

    out = {
        "weights_bytes": info.tensor_bytes - (released_bytes(info.path) if repack else 0),
        "repacked_bytes": repacked_bytes(info.path) if repack else 0,
        "kv_bytes": kv_cache_bytes(info, n_ctx, kv_type, swa_full=swa_full),
        "compute_bytes": compute_bytes(info, n_ctx, n_ubatch, n_outputs, n_seq),
    }
    out["total_bytes"] = sum(out.values())
    return out


def _feed_forward(info) -> int:
    value = info.metadata.get(f"{info.architecture}.feed_forward_length")
    if isinstance(value, (list, tuple)):
        value = max((v for v in value if isinstance(v, int)), default=None)
    return value if isinstance(value, int) and value > 0 else 4 * info.n_embd


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to
