"""Splitting a model across machines (engine.rpc): the worker a machine runs, what `doctor --rpc` says of
workers, the placement `show --rpc` prints, and what happens when a worker is lost mid-generation."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import Phrase, SettingError, UsageError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSECURE = ("the RPC protocol has no authentication or encryption: anyone who can reach {where} can run"
            " computations on this machine and read what it is sent; use it only on a trusted network")


def parse_endpoints(text: Optional[str]) -> tuple[str, ...]:
    """--rpc HOST:PORT[,HOST:PORT...] (engine.rpc.parse_endpoints)."""
    from ..engine.rpc import parse_endpoints as parse

    return parse(text)


def parse_tensor_split(text: Optional[str]) -> Optional[tuple[float, ...]]:
    """--tensor-split 3,1[,...]: proportions per device, in llama.cpp's device order (RPC workers first)."""
    if not text:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 0 or v != v for v in values) or not any(values):
        raise SettingError("tensor_split", text, "use proportions per device, e.g. 3,1 (RPC workers first, then local GPUs)")
    return values


def run_worker(host: str, port: int, *, threads: Optional[int], devices: Optional[list[str]], cache: Optional[Path],
               on_started: Callable[[str], None]) -> None:
    """Serve this machine's devices to RPC clients until Ctrl-C (KeyboardInterrupt) or the server fails
    (LocalrunError). llama.cpp's server prints to stdout: that goes to stderr, stdout stays clean."""
    import socket
    import time

    from ..engine.llama import default_threads
    from ..engine.rpc import local_devices, serve_worker
    from ..errors import LocalrunError

    if not 0 < port < 65536:
        raise SettingError("port", port, "use 1..65535")
    if threads is not None and not 0 < threads <= 4 * (os.cpu_count() or 1):
        raise SettingError("threads", threads, f"use 1..{4 * (os.cpu_count() or 1)}")
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:  # a clear error for a port in use or an address not here, before llama.cpp tries
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise LocalrunError(Phrase("cannot listen on {endpoint}: {why} (another worker there? pick {port})", endpoint=endpoint,
                                   why=(exc.strerror or str(exc)).lower())) from None
    chosen = local_devices(devices)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    os.dup2(2, 1)  # llama.cpp's banner and per-connection lines
    thread = serve_worker(f"{host}:{port}", [d for d, _, _ in chosen], threads or default_threads(), cache)
    thread.join(0.3)
    if not thread.is_alive():
        raise LocalrunError(f"llama.cpp's RPC server could not start on {endpoint} (see above)")
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it, even started where SIGINT was ignored
    on_started(f"worker on {endpoint}: {', '.join(f'{name} ({desc})' for _, name, desc in chosen)}; "
               f"tensor cache {cache or 'off'}; Ctrl-C stops it")
    while thread.is_alive():
        time.sleep(0.2)
    raise LocalrunError(f"llama.cpp's RPC server on {endpoint} stopped (see above)")


def describe_workers(endpoints: tuple[str, ...]) -> list[dict[str, Any]]:
    """What `doctor --rpc` lists per worker: its protocol version and each device's free and total memory,
    or the error that keeps it from being used."""
    from ..engine.rpc import RpcError, probe

    out = []
    for endpoint in endpoints:
        try:
            worker = probe(endpoint)
        except RpcError as exc:
            out.append({"endpoint": endpoint, "error": exc.message})
            continue
        out.append({"endpoint": endpoint, "protocol": ".".join(map(str, worker.version)),
                    "devices": [{"name": f"RPC{i}[{endpoint}]", "free": free, "total": total}
                                for i, (free, total) in enumerate(worker.memory)]})
    return out


def plan(path: Path, endpoints: tuple[str, ...], *, gpu_layers: str, tensor_split: Optional[str], ctx: int,
         kv_type: str) -> list[dict[str, Any]]:
    """Where llama.cpp would put a model's layers with these workers (and this machine's GPUs): per device,
    its layers, weight bytes and KV bytes (engine.rpc.placement). The workers are asked their free memory;
    nothing is loaded."""
    from ..engine.gguf_info import read_info
    from ..engine.llama import gpu_memory
    from ..engine.model import parse_gpu_layers
    from ..engine.rpc import placement, probe

    layers = parse_gpu_layers(gpu_layers)
    devices = []
    for endpoint in endpoints:
        worker = probe(endpoint)
        devices += [(f"RPC{i}[{endpoint}]", free) for i, (free, _) in enumerate(worker.memory)]
    devices += [(name, free) for name, free, _ in gpu_memory()]
    split = parse_tensor_split(tensor_split)
    if split is not None and len(split) > len(devices):
        raise UsageError(Phrase("{tensor_split} has {n} proportions for {m} devices: give one per device", n=len(split),
                                m=len(devices)))
    n_gpu = -1 if layers == "auto" else int(layers)
    if not devices:
        n_gpu = 0
    info = read_info(path)
    rows = placement(info, devices, gpu_layers=n_gpu, tensor_split=split, n_ctx=ctx, kv_type=kv_type)
    return [{"device": r.device, "layers": _ranges(r.layers, info.n_layer), "n_layers": len(r.layers),
             "weights_bytes": r.weights, "kv_bytes": r.kv} for r in rows]


def _ranges(layers: list[int], n_layer: int) -> str:
    """'0-9, output' for layers [0..9, n_layer]."""
    parts, run = [], []
    for il in layers:
        if il == n_layer:
            continue
        if run and il == run[-1] + 1:
            run.append(il)
        else:
            if run:
                parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [il]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    if n_layer in layers:
        parts.append("output")
    return ", ".join(parts) or "input only"


def fail_over_lost_workers(pool) -> None:
    """In a server: a worker lost mid-generation fails only the requests of the models split over it (they
    are dropped), instead of the whole process."""
    from ..engine import rpc

    def lost(endpoints: list[str], detail: str) -> None:
        pool.abandon(endpoints, f"lost the RPC worker at {', '.join(endpoints)} during the answer (it stopped answering):"
                                " the model split over it was unloaded; restart the worker and the server to use it again")

    rpc.on_lost = lost


def leave_when_workers_lost() -> None:
    """In a process answering one request (`run`, `chat`, `bench` in-process): a worker lost mid-generation
    ends it with one line and exit 1, rather than llama.cpp's abort and its core dump."""
    from ..engine import rpc

    def lost(endpoints: list[str], detail: str) -> None:
        sys.stderr.write(f"error: lost the RPC worker at {', '.join(endpoints)} during the answer (it stopped answering):"
                         " restart it (`localrun worker`) and run again\n")
        sys.stderr.flush()
        os._exit(1)

    rpc.on_lost = lost


def leave_if_workers_lost(code: int) -> None:
    """A server that lost a worker has threads stuck inside llama.cpp for good (waiting on that worker):
    Python's exit would wait for them, and llama.cpp's teardown too. Leave at once with `code` instead."""
    from ..engine import rpc

    if rpc.lost_any():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
