"""llama.cpp's RPC backend: a model split across machines.

A worker (`localrun worker`) exposes this machine's ggml devices (the CPU, or its GPUs) with llama.cpp's own
RPC server (ggml_backend_rpc_start_server). A client names workers (--rpc HOST:PORT,...): each worker's
devices are registered with ggml (ggml_backend_rpc_add_server + ggml_backend_register) and the model places
layers on them as it would on local GPUs (engine.model passes the devices explicitly, so a model loaded
without --rpc in the same process never uses a worker another model added).

llama-cpp-python does not wrap any of this; the calls go through ctypes to libggml-rpc in its wheel (built
with -DGGML_RPC=ON by scripts/build_llama_cpp.sh). Before llama.cpp connects (it aborts the process on a
refused connection or another protocol version), `probe` speaks the protocol's handshake itself: a worker
that is unreachable, busy with another client, or of another version is one clear error.

The protocol has no authentication or encryption: workers bind loopback unless told otherwise.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import EngineError, Phrase, UsageError

# ggml-rpc.h of the llama.cpp that llama-cpp-python pins: a worker of another major (or a newer minor)
# version is refused, as llama.cpp's own client does.
PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 7, 0, 0
DEFAULT_PORT = 50052
CONNECT_TIMEOUT_S = 5.0
_HELLO, _DEVICE_COUNT, _GET_DEVICE_MEMORY = 14, 15, 11  # rpc_cmd values
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities in the hello (none offered here: plain TCP)

NO_RPC_BUILD = ("this llama.cpp build has no RPC backend (libggml-rpc): rebuild it with `make` "
                "(scripts/build_llama_cpp.sh builds with -DGGML_RPC=ON)")


class RpcError(EngineError):
    """A worker that cannot be used: unreachable, busy, another protocol version, or lost."""


@dataclass(frozen=True)
class Worker:
    endpoint: str
    version: tuple[int, int, int]
    memory: tuple[tuple[int, int], ...]  # (free, total) bytes per device


def parse_endpoints(text: Optional[str]) -> tuple[str, ...]:
    """HOST:PORT[,HOST:PORT...] as given to --rpc (UsageError naming a bad one); () for none."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        part = part.strip()
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(Phrase("invalid {rpc} endpoint {part!r}: use HOST:PORT, e.g. 192.168.1.20:{port}", part=part,
                                    port=DEFAULT_PORT))
        if part in out:
            raise UsageError(Phrase("{rpc} names {part} twice: name each worker once", part=part))
        out.append(part)
    return tuple(out)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def probe(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> Worker:
    """Ask a worker its protocol version and its devices' memory, as llama.cpp's client would (a connection
    of our own, closed after). RpcError naming the worker when it cannot be used."""
    host, port = _split(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        raise RpcError(f"cannot reach the RPC worker at {endpoint}: no answer within {timeout:.0f} s (is the address right, a firewall?)") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise RpcError(f"cannot reach the RPC worker at {endpoint}: {reason.lower()} (start `localrun worker` there, or check the address)") from None
    try:
        with sock:
            sock.settimeout(timeout)
            major, minor, patch = _call(sock, _HELLO, bytes(_CAPS), 4 + _CAPS)[:3]
            version = (major, minor, patch)
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise RpcError(
                    f"the RPC worker at {endpoint} speaks protocol {major}.{minor}.{patch}, this localrun"
                    f" {PROTO_MAJOR}.{PROTO_MINOR}.{PROTO_PATCH}: run the same localrun (llama.cpp) version on both machines"
                )
            (count,) = struct.unpack("<I", _call(sock, _DEVICE_COUNT, b"", 4))
            memory = tuple(struct.unpack("<QQ", _call(sock, _GET_DEVICE_MEMORY, struct.pack("<I", i), 16)) for i in range(count))
    except socket.timeout:
        raise RpcError(f"the RPC worker at {endpoint} does not answer: it serves one client at a time, and another"
                       " is connected (a localrun server?); stop that one, or start another worker") from None
    except (OSError, struct.error, ConnectionError) as exc:
        raise RpcError(f"the RPC worker at {endpoint} closed the connection ({exc or 'no reply'}): is it a localrun worker (llama.cpp rpc-server)?") from None
    return Worker(endpoint, version, memory)


def _call(sock: socket.socket, cmd: int, payload: bytes, answer: int) -> bytes:
    """One request/response: | cmd u8 | size u64 | payload | -> | size u64 | answer |."""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _read(sock, 8))
    if size != answer:
        raise ConnectionError(f"a reply of {size} bytes where {answer} were expected")
    return _read(sock, answer)


def _read(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


# -- the library ------------------------------------------------------------------------------------

_lib = None
_added: dict[str, list[int]] = {}  # endpoint -> its devices (ggml_backend_dev_t), registered once per process
_users: dict[str, int] = {}  # endpoint -> models loaded over it now
_lost: set[str] = set()  # workers lost while this process used them: llama.cpp keeps their dead connection
_lock = threading.Lock()


def library():
    """libggml-rpc from llama-cpp-python's wheel, with its calls declared (RpcError when the build has none)."""
    global _lib
    if _lib is not None:
        return _lib
    from .llama import ggml, wheel_library

    lib = wheel_library("libggml-rpc")
    if lib is None:
        raise RpcError(NO_RPC_BUILD)
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_rpc_start_server.restype = None
    lib.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.c_void_p)]
    g = ggml()
    g.ggml_backend_register.argtypes = [ctypes.c_void_p]
    g.ggml_backend_register.restype = None
    g.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    g.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    g.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    g.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    _lib = lib
    return lib


def add_workers(endpoints: tuple[str, ...]) -> list[int]:
    """The ggml devices of these workers, in order (each worker probed and registered once per process)."""
    from .llama import ggml

    devices: list[int] = []
    if not endpoints:
        return devices
    lib = library()
    with _lock:
        for endpoint in endpoints:
            if endpoint in _lost:
                raise RpcError(f"the RPC worker at {endpoint} was lost while this process used it: restart this"
                               " process (`localrun stop --server` for the background server) to use it again")
            if endpoint not in _added or not _users.get(endpoint):
                probe(endpoint)  # again when no model uses it: llama.cpp connects anew then, and aborts on failure
            if endpoint not in _added:
                reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
                if not reg:
                    raise RpcError(f"llama.cpp could not add the RPC worker at {endpoint}")
                g = ggml()
                g.ggml_backend_register(reg)
                _added[endpoint] = [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]
                watch_for_lost_workers()
            devices += _added[endpoint]
        for endpoint in endpoints:
            _users[endpoint] = _users.get(endpoint, 0) + 1
    return devices


def release_workers(endpoints: tuple[str, ...]) -> None:
    """A model split over these workers was freed."""
    with _lock:
        for endpoint in endpoints:
            _users[endpoint] = max(0, _users.get(endpoint, 0) - 1)


def lost_any() -> bool:
    return bool(_lost)


def any_added() -> bool:
    return bool(_added)


def endpoint_of(device_name: str) -> Optional[str]:
    """The worker of an RPC device ("RPC0[host:port]"), or None for a local device."""
    if device_name.startswith("RPC") and device_name.endswith("]") and "[" in device_name:
        return device_name[device_name.index("[") + 1 : -1]
    return None


# -- a worker lost mid-generation --------------------------------------------------------------------
#
# ggml-rpc aborts the process when a worker stops answering (RPC_STATUS_ASSERT -> GGML_ABORT). ggml calls an
# abort callback first: there, with the workers that no longer answer, the process's own `on_lost` decides
# (a server fails that model's requests and keeps serving; `run` says so in one line and leaves: both set
# in runtime.workers), and the thread that hit it never returns into llama.cpp. With no `on_lost` (and for
# an abort that is not RPC's) llama.cpp aborts as it would have.

on_lost = None
_ABORT = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_callback = None


def watch_for_lost_workers() -> None:
    global _callback
    if _callback is not None:
        return
    from .llama import ggml

    def aborted(message: bytes) -> None:
        text = (message or b"").decode(errors="replace")
        if ("RPC" not in text and "rpc" not in text) or on_lost is None:
            return  # llama.cpp aborts as it would have (and says why)
        lost = [e for e in _added if not _answers(e)] or list(_added)
        _lost.update(lost)
        try:
            on_lost(lost, text)  # a server: it leaves without llama.cpp's teardown when it stops (lost_any)
        except Exception:  # noqa: BLE001 - returning would let llama.cpp abort the whole server
            import traceback

            traceback.print_exc()
        threading.Event().wait()  # never back into llama.cpp (it would abort)

    _callback = _ABORT(aborted)
    g = ggml()
    g.ggml_set_abort_callback.argtypes = [_ABORT]
    g.ggml_set_abort_callback.restype = ctypes.c_void_p
    g.ggml_set_abort_callback(_callback)


def _answers(endpoint: str) -> bool:
    host, port = _split(endpoint)
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


# -- the worker side ---------------------------------------------------------------------------------

def local_devices(names: Optional[list[str]] = None) -> list[tuple[int, str, str]]:
    """(device, name, description) of this machine's devices a worker exposes: the named ones, else its
    GPUs, else the CPU (as llama.cpp's rpc-server chooses). UsageError for a name it does not have."""
    from .llama import CPU_DEVICE, ggml

    library()
    g = ggml()
    every = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        name = g.ggml_backend_dev_name(dev).decode(errors="replace")
        if endpoint_of(name) is None:
            every.append((dev, name, (g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"), g.ggml_backend_dev_type(dev)))
    if names:
        chosen = []
        for wanted in names:
            match = [d for d in every if d[1].casefold() == wanted.casefold()]
            if not match:
                raise UsageError(f"no device {wanted!r} here: this machine has {', '.join(d[1] for d in every)}")
            chosen.append(match[0])
    else:
        chosen = [d for d in every if d[3] != CPU_DEVICE] or [d for d in every if d[3] == CPU_DEVICE]
    return [(dev, name, desc) for dev, name, desc, _ in chosen]


def serve_worker(endpoint: str, devices: list[int], threads: int, cache: Optional[Path]) -> threading.Thread:
    """Start llama.cpp's RPC server on `endpoint` for `devices` in a daemon thread (it serves until the
    process ends) and return the thread; it ends early when the server could not start (port in use)."""
    lib = library()
    array = (ctypes.c_void_p * len(devices))(*devices)
    args = (endpoint.encode(), str(cache).encode() if cache else None, threads, len(devices), array)
    thread = threading.Thread(target=lambda: lib.ggml_backend_rpc_start_server(*args), name="localrun-rpc-worker", daemon=True)
    thread.array = array  # kept alive with the thread
    thread.start()
    return thread


# -- where llama.cpp puts the layers -------------------------------------------------------------------

@dataclass
class Placement:
    device: str  # "CPU", "CUDA0", "RPC0[host:port]"
    layers: list[int]  # repeating layers (n_layer: the output layer)
    weights: int  # bytes
    kv: int  # bytes of KV cache for those layers

    @property
    def endpoint(self) -> Optional[str]:
        return endpoint_of(self.device)


def placement(info, devices: list[tuple[str, int]], *, gpu_layers: int, tensor_split: Optional[tuple[float, ...]],
              n_ctx: int, kv_type: str = "f16") -> list[Placement]:
    """Which device gets which layers, their weights and KV, as llama.cpp's load_tensors assigns them
    (src/llama-model.cpp): the input layer on the CPU; the last `gpu_layers` of the repeating layers plus
    the output layer over `devices` ((name, free bytes), in llama.cpp's order: RPC workers first, then local
    GPUs), split by `tensor_split` or else by free memory; the rest on the CPU."""
    from .gguf_info import kv_cache_bytes

    n_layer = info.n_layer
    per_layer_kv = _kv_per_layer(info, n_ctx, kv_type, kv_cache_bytes)
    if gpu_layers < 0:
        gpu_layers = n_layer + 1
    shares = list(tensor_split) if tensor_split and any(tensor_split) else [free for _, free in devices]
    shares = (shares + [0.0] * len(devices))[: len(devices)]
    total = sum(shares) or 1.0
    bounds, acc = [], 0.0
    for share in shares:
        acc += share
        bounds.append(acc / total)
    start = max(n_layer + 1 - gpu_layers, 0)
    active = min(gpu_layers, n_layer + 1) if devices else 0
    rows = {"CPU": Placement("CPU", [], info.input_bytes, 0)}
    for name, _ in devices:
        rows[name] = Placement(name, [], 0, 0)
    for il in range(n_layer + 1):
        if il < start or il - start >= active:
            name = "CPU"
        else:
            import bisect

            name = devices[min(bisect.bisect_right(bounds, (il - start) / active), len(devices) - 1)][0]
        row = rows[name]
        row.layers.append(il)
        row.weights += info.output_bytes if il == n_layer else info.layer_bytes[il] if il < len(info.layer_bytes) else 0
        row.kv += per_layer_kv[il] if il < n_layer else 0
    return list(rows.values())


def _kv_per_layer(info, n_ctx: int, kv_type: str, kv_cache_bytes) -> list[int]:
    """Each repeating layer's share of the KV cache (kv_cache_bytes, split by each layer's row width)."""
    total = kv_cache_bytes(info, n_ctx, kv_type)
    swa = info.swa_layers or (False,) * info.n_layer
    widths = []
    for n_kv, is_swa in zip(info.kv_heads, swa):
        dim_k = (info.head_dim_k_swa or info.head_dim_k) if is_swa else info.head_dim_k
        dim_v = (info.head_dim_v_swa or info.head_dim_v) if is_swa else info.head_dim_v
        widths.append(n_kv * (dim_k + dim_v))
    width = sum(widths) or 1
    shares = [total * w // width for w in widths]
    if shares:
        shares[-1] += total - sum(shares)  # what integer division left over
    return shares
