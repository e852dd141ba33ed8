"""What a model takes in memory and the context it is given: the context a request may fill (asked for, brought by
the model, or sized by default from the memory free now, capped to the trained length), what a load takes by what
holds it (the weights, llama.cpp's repacked copy, the KV cache, the compute buffers), and the memory there is (RAM,
the GPUs' share). The loader, the pool and the reports all ask here."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .options import FALLBACK_CONTEXT, LoadSpec

# (engine.gguf_info is imported where a file is read: importing it loads llama.cpp's library and gguf's tables,
# 60 ms a server with no model, or a load's caller such as the server's pool, need not pay at start)


CONTEXT_CAP = 32768  # the largest default: a longer context is asked for (--ctx, num_ctx), not given unasked


def context_for(ctx: Optional[int], brought, path, streams: int = 1, kv_type: str = "f16", *, embeddings: bool = False) -> int:
    """The context one request may fill: the one asked for (--ctx, num_ctx), else the one the model brings
    (its catalogue entry, a Modelfile's num_ctx), at most the length the model at `path` was trained on
    (capped_context says so); else sized for it by default_context (an embeddings context and a model not read
    yet, `path` None: FALLBACK_CONTEXT)."""
    from ..engine.gguf_info import read_info

    given = ctx if ctx is not None else brought.context
    if given:
        trained = read_info(path).context_length if path is not None else None
        return min(given, trained) if trained else given
    if embeddings or path is None:
        return FALLBACK_CONTEXT
    return default_context(read_info(path), streams, kv_type)


def capped_context(ctx: Optional[int], brought, info, name: str) -> Optional[str]:
    """What to tell a user whose context (--ctx, else the model's num_ctx) is past the length the model was
    trained on, which context_for gives instead, as Ollama caps it and says so; None when it is not."""
    trained = info.context_length
    given = ctx if ctx is not None else brought.context
    if not given or not trained or given <= trained:
        return None
    what = f"--ctx {given}" if ctx is not None else f"{name}'s num_ctx {given}"  # (a catalogue entry's context, a Modelfile's)
    return f"{what} is more than {name} was trained on ({trained} tokens): using {trained}"


def default_context(info, streams: int = 1, kv_type: str = "f16", available: Optional[int] = None) -> int:
    """A model's context when neither the request nor the catalogue names one (as Ollama sizes its default
    from the memory it has): the trained length up to CONTEXT_CAP, halved while its KV cache would take more
    than a quarter of the memory free now (`available`), for each of the context's KV `streams` (a server's
    slots keep one each, or one pool: LoadSpec.kv_streams); never below FALLBACK_CONTEXT, nor above the
    trained length."""
    from ..engine.gguf_info import kv_cache_bytes

    trained = info.context_length or FALLBACK_CONTEXT
    floor = min(trained, FALLBACK_CONTEXT)
    if available is None:
        available = available_memory()
    n_ctx = min(trained, CONTEXT_CAP)
    while n_ctx > floor and kv_cache_bytes(info, n_ctx * streams, kv_type) > available // 4:
        n_ctx //= 2
    return max(n_ctx, floor)


def estimate_bytes(path: Path, spec: LoadSpec, ref: Optional[str] = None) -> int:
    """What a model takes loaded with `spec`, in all (see estimate_breakdown)."""
    return estimate_breakdown(path, spec, ref)["total_bytes"]


def estimate_breakdown(path: Path, spec: LoadSpec, ref: Optional[str] = None, repack: Optional[bool] = None) -> dict[str, int]:
    """What a model takes loaded with `spec`, by what holds it (engine.footprint): the weights (the mapped
    file), llama.cpp's repacked copy of them (CPU_REPACK: 597 MiB for Qwen2.5 1.5B Q4_K_M, where the CPU is
    the only device), the KV cache (a stream of the context per slot, or one pool of it: LoadSpec.kv_streams),
    and the compute buffers for a micro-batch of
    `batch` tokens with llama.cpp's logits (a vocabulary of floats for each row a batch may ask for: one per
    slot, held twice, as the output layer's result and as the copy handed out; every row of an embeddings
    batch, which dominate for gemma-3's 262k vocabulary). Mirrors how runtime.loader loads each kind.
    `repack`: whether llama.cpp repacks here (None: no GPU and no RPC worker, engine.footprint.repacks_here)."""
    from .. import hub
    from ..engine.footprint import footprint, repacks_here
    from ..engine.gguf_info import read_info

    info = read_info(path)
    brought = hub.defaults_for(ref or str(path))
    ctx = context_for(spec.ctx or None, brought, path, spec.kv_streams(info), spec.kv_type, embeddings=spec.kind == "embed")
    repack = repacks_here(bool(spec.rpc)) if repack is None else repack
    if spec.kind == "embed":  # one micro-batch holds a whole context; a vocabulary row for each of a batch's rows
        return footprint(info, ctx, spec.kv_type, n_ubatch=ctx, n_outputs=max(1, spec.batch // 2), repack=repack)
    decoding = spec.decoding(brought.draft)
    rows = decoding.draft_max + 1 if decoding.draft else 1  # a verified draft reads a row per token
    streams = spec.kv_streams(info)  # a stream of the context per slot, or one pool of it
    return footprint(info, ctx * streams, spec.kv_type, n_ubatch=spec.batch, n_outputs=spec.parallel * rows,
                     n_seq=streams, repack=repack)


def gpu_free_bytes() -> Optional[int]:
    """Free memory on the GPUs llama.cpp can use, all together (None where it has none: a CPU build)."""
    from ..engine.llama import gpu_memory

    devices = gpu_memory()
    return sum(free for _, free, _ in devices) if devices else None


def gpu_share(path: Path, gpu_layers: str, has_gpu: bool) -> float:
    """The share of a model that --gpu-layers puts on a GPU (repeating layers plus the output layer, as
    llama.cpp counts them), to budget against GPU memory: 0 without a GPU."""
    from ..engine.gguf_info import read_info

    if not has_gpu or gpu_layers in ("0", 0):
        return 0.0
    if gpu_layers in ("auto", "-1", -1):
        return 1.0
    total = read_info(path).n_layer + 1
    return min(int(gpu_layers), total) / total


def available_memory() -> int:
    """RAM the kernel can hand out now (MemAvailable), the room a new model's weights and KV go into. Read from
    /proc/meminfo where it is plain (psutil's value then: importing psutil cost every in-process run 10 ms);
    psutil where it is missing or odd (an old kernel, a container's distorted counts) or there is no /proc."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            fields = dict(line.split(None, 2)[:2] for line in meminfo if line.startswith((b"MemTotal:", b"MemAvailable:")))
        available, total = int(fields[b"MemAvailable:"]) * 1024, int(fields[b"MemTotal:"]) * 1024
        if 0 < available <= total:
            return available
    except (OSError, KeyError, ValueError):
        pass
    import psutil

    return int(psutil.virtual_memory().available)
