"""The llama_cpp module, imported on first use: its logging, Ctrl-C around its callbacks, and build facts."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Optional

from ..lazy import submodule_first

from contextvars import ContextVar

# What hears a model's load progress (0..1, llama.cpp's progress callback), where the caller loading it set one:
# the resident server's pool, so that `ps` shows a model loading (engine.model.Engine reads it).
load_progress: ContextVar[Optional[Callable[[float], None]]] = ContextVar("load_progress", default=None)
_llama = None  # the llama_cpp module, imported on first use
_llama_lock = threading.Lock()  # a server's first load and a request asking for the GPUs may both ask first
_log_callback = None  # kept referenced: llama.cpp holds the pointer
_log_sink: Optional[list] = None


def library_fingerprint() -> str:
    """The llama.cpp libraries llama_cpp would load (each one's path, size and mtime, hashed), found without
    importing it: two builds of one llama-cpp-python version (a CPU and a CUDA wheel) differ here, so a
    session or server made by one is not taken for the other's."""
    import hashlib
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llama_cpp")
    where = Path(spec.origin).parent / "lib" if spec and spec.origin else None
    digest = hashlib.sha256()
    if where is not None and where.is_dir():
        for lib in sorted(where.glob("lib*.so*")) + sorted(where.glob("*.dylib")):
            if lib.is_file() and not lib.is_symlink():
                st = lib.stat()
                digest.update(f"{lib}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _set_log_callback(llama_cpp) -> None:
    if _log_callback is not None:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def llama_cpp_module():
    """Import llama_cpp lazily (it loads a shared library) and silence its logging.

    Call it before anything imports numpy (the gguf package does) wherever a model is loaded. On a CUDA
    build made with some toolchains (seen on an H100 machine: CUDA 13, CXX=/opt/gcc/bin/g++),
    libggml-cuda.so exports its own copy of libstdc++'s locale symbols; when numpy has already loaded the
    system libstdc++, the tokenizer's std::regex segfaults inside llama_model_load_from_file.
    """
    global _llama, _log_callback
    if _llama is not None:
        return _llama
    with _llama_lock:
        if _llama is not None:
            return _llama
        # Its ctypes bindings (every llama_* function), not its high-level Llama class (numpy, jinja2 and
        # diskcache: 0.27 s of CPU on every start against 0.11 s).
        # Its own __init__, when something asks for the rest of the package, sets llama-cpp-python's log
        # callback: ours is set again after it.
        llama_cpp = submodule_first("llama_cpp", "llama_cpp", after_init=_set_log_callback)

        show = bool(os.environ.get("LOCALRUN_LLAMA_LOG"))

        @llama_cpp.llama_log_callback
        def _log(level, text, user_data):  # llama.cpp's chatter stays off the terminal unless asked for
            if _log_sink is not None:
                _log_sink.append(text.decode("utf-8", "replace"))
            if show:
                sys.stderr.write(text.decode("utf-8", "replace"))

        _log_callback = _log
        _set_log_callback(llama_cpp)
        llama_cpp.llama_backend_init()
        _llama = llama_cpp
    return _llama


def loaded() -> bool:
    """Whether llama.cpp was loaded in this process (nothing to free otherwise)."""
    return _llama is not None


@contextmanager
def captured_llama_log() -> Iterator[list]:
    """Collect llama.cpp's log lines (e.g. the buffer sizes it allocates) while the block runs."""
    global _log_sink
    llama_cpp_module()
    _log_sink = []
    try:
        yield _log_sink
    finally:
        _log_sink = None


@contextmanager
def log_listener(listener) -> Iterator[None]:
    """Hand each of llama.cpp's log lines to `listener` while the block runs (the quantizer's progress)."""
    global _log_sink

    class _Sink(list):
        def append(self, text: str) -> None:
            listener(text)

    llama_cpp_module()
    previous, _log_sink = _log_sink, _Sink()
    try:
        yield
    finally:
        _log_sink = previous


@contextmanager
def deferred_interrupt() -> Iterator[list]:
    """Hold Ctrl-C while llama.cpp calls back into Python, and raise it once llama.cpp has returned.

    A KeyboardInterrupt raised inside a ctypes callback (the log callback above, which model load calls
    hundreds of times) is swallowed by ctypes: it printed "Exception ignored on calling ctypes callback"
    and the command carried on, 9 times in 30 Ctrl-Cs during `localrun run`'s load. Here SIGINT only
    records itself (the returned list fills); the model's progress callback then stops the load, and
    KeyboardInterrupt is raised at the end of the block. Only where Python's own handler is in place on
    the main thread (not under uvicorn, which handles signals itself).
    """
    import signal
    import threading

    hit: list = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield hit
        return
    signal.signal(signal.SIGINT, lambda *_: hit.append(True))
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hit:
        raise KeyboardInterrupt


@lru_cache(maxsize=1)
def _package_version() -> str:
    """llama-cpp-python's version, from its metadata: asking the package would import all of it (see llama_cpp_module)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return llama_cpp_module().__version__


def system_info() -> dict:
    ll = llama_cpp_module()
    return {
        "llama_cpp_python": _package_version(),
        "system_info": ll.llama_print_system_info().decode("utf-8", "replace").strip(),
        "gpu_offload": supports_gpu_offload(),
        "mmap": bool(ll.llama_supports_mmap()),
    }


def build_id() -> str:
    """The llama-cpp-python version that made a saved KV state. A session's identity (runtime.sessions) keeps
    build_system_info() beside it, which names the backends and CPU features: a CPU and a CUDA wheel of one
    version are two builds there, and a state from one is refused by the other. That is deliberate: the state
    format would load, but the KV in it was computed by other kernels, so a resumed answer could differ from
    one computed here (the reason states are refused across versions too)."""
    return f"llama-cpp-python {_package_version()}"


def build_system_info() -> str:
    return llama_cpp_module().llama_print_system_info().decode("utf-8", "replace").strip()


def default_threads() -> int:
    """llama.cpp's threads by default: one per physical core this process may run on (llama.cpp's
    cpu_get_num_math and Ollama count cores, not the logical CPUs of hyper-threading, whose siblings share a
    core's units and only wait for each other at llama.cpp's barriers)."""
    return cpu_counts()[0]


def cpu_counts() -> tuple[int, int]:
    """(physical cores, logical CPUs) this process may run on: its CPU affinity (a pytest-xdist worker's share, a
    container's cpuset), cores counted by their topology in /sys (each logical CPU where there is none)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        n = max(1, os.cpu_count() or 1)
        return n, n
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as package, open(topology + "core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores)), max(1, len(cpus))


class CpuLoad:
    """How much of this process's CPUs other processes use: over the time between two `busy()` calls, the CPU
    time the system spent on them (/proc/stat: busy and stolen by the hypervisor) less this process's own
    (/proc/self/stat, every thread), as a number of cores. llama.cpp's threads spin at each barrier of a step:
    one of them sharing a core with a busy process holds up all the others (SmolLM2 decoded at 0.48 tokens/s
    with 2 threads on 2 cores beside one busy process, 64.8 with 1 thread)."""

    def __init__(self) -> None:
        import threading

        try:
            self.cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
        except AttributeError:
            self.cpus = set()
        self.lock = threading.Lock()  # requests on several threads ask it
        self.last = self._read()

    def busy(self) -> Optional[float]:
        """Cores used by other processes since the last call (or since this was made); None where /proc does not
        say (not Linux), or over too short a time to tell (under 50 ms)."""
        now = self._read()
        with self.lock:
            before, self.last = self.last, now
        if now is None or before is None or now[0] - before[0] < 0.05:
            return None
        wall, system, own = (a - b for a, b in zip(now, before))
        return max(0.0, (system - own) / wall)

    def _read(self) -> Optional[tuple[float, float, float]]:
        """(monotonic seconds, busy CPU seconds of this process's CPUs, this process's CPU seconds)."""
        import time

        try:
            tick = os.sysconf("SC_CLK_TCK")
            busy = 0
            with open("/proc/stat") as stat:
                for line in stat:
                    name, *fields = line.split()
                    if name in self.cpus:  # user nice system idle iowait irq softirq steal ...
                        values = [int(v) for v in fields[:8]] + [0] * (8 - len(fields[:8]))
                        busy += sum(values) - values[3] - values[4]
            with open("/proc/self/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime (of every thread)
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), busy / tick, own / tick


def busy_advice(others: Optional[float], threads: int) -> Optional[str]:
    """One line when other processes take at least half a core of those `threads` would use: the fix is fewer
    threads (--threads); None when they leave them room."""
    cores = cpu_counts()[0]
    if others is None or threads <= 1 or others < 0.5 or threads + others <= cores + 0.25:
        return None
    fewer = max(1, min(threads - 1, round(cores - others)))
    return (f"this machine is busy: other processes use {others:.1f} of its {cores} cores, and llama.cpp's {threads} "
            f"threads wait for each other at every step when one shares a core; if answers come slowly, --threads {fewer}")


def wheel_library(stem: str):
    """A library of llama-cpp-python's wheel (libggml, libggml-rpc ...) through ctypes, or None where the
    build has none: one llama.cpp has loaded already is the same handle."""
    import ctypes
    from pathlib import Path

    lib_dir = Path(llama_cpp_module().__file__).parent / "lib"
    found = sorted(lib_dir.glob(f"{stem}.so*")) + sorted(lib_dir.glob(f"{stem}.dylib"))
    return ctypes.CDLL(str(found[0])) if found else None


def ggml():
    """llama.cpp's ggml library through ctypes (loaded already by llama_cpp: the same handle), with the
    backend-device calls llama-cpp-python does not wrap declared."""
    import ctypes

    global _ggml
    if _ggml is not None:
        return _ggml
    lib = wheel_library("libggml")
    if lib is None:
        return None
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    _ggml = lib
    return lib


_ggml = None
CPU_DEVICE, GPU_DEVICE, IGPU_DEVICE = 0, 1, 2  # ggml_backend_dev_type (ACCEL 3)


def devices() -> list[tuple[str, str, int, int, int]]:
    """(name, description, type, free bytes, total bytes) of every ggml backend device llama.cpp can place
    layers on: the CPU, GPUs, and the devices of RPC workers added (engine.rpc)."""
    import ctypes

    lib = ggml()
    if lib is None:
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        name = lib.ggml_backend_dev_name(dev).decode(errors="replace")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if not name.startswith("RPC"):  # asking a worker goes over the network (engine.rpc.probe does, with a timeout)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append((name,
                    (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    lib.ggml_backend_dev_type(dev), free.value, total.value))
    return out


def local_gpus() -> list[int]:
    """This machine's GPUs as llama.cpp would use them by default (discrete GPUs, else integrated ones):
    their ggml device handles. RPC workers' devices are not among them (engine.rpc)."""
    lib = ggml()
    if lib is None:
        return []
    found: dict[int, list[int]] = {GPU_DEVICE: [], IGPU_DEVICE: []}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        if kind in found and not device_name(dev).startswith("RPC"):
            found[kind].append(dev)
    return found[GPU_DEVICE] or found[IGPU_DEVICE]


def device_name(dev: int) -> str:
    return ggml().ggml_backend_dev_name(dev).decode(errors="replace")


def supports_gpu_offload() -> bool:
    """Whether layers can go anywhere but the CPU: a GPU, or an RPC worker's device. (llama.cpp's own
    llama_supports_gpu_offload() also says yes for a build with RPC and no worker added.)"""
    return any(kind in (GPU_DEVICE, IGPU_DEVICE) for _, _, kind, _, _ in devices())  # not ACCEL (BLAS, AMX): CPU-side


def gpu_memory() -> list[tuple[str, int, int]]:
    """(name, free bytes, total bytes) of each GPU llama.cpp can use (its ggml backend devices of type GPU):
    none on a CPU build. What the resident server budgets offloaded layers against."""
    return [(name, free, total) for name, _, kind, free, total in devices() if kind == GPU_DEVICE and not name.startswith("RPC")]
