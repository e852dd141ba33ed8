"""The resident models of a server: loaded when a request names them, kept for their keep-alive, evicted
least recently used when the next one would not fit, reloaded when a request asks for other load-time
options. What Ollama's scheduler (server/sched.go) does, on the engine core.

Each resident model has its own continuous-batching scheduler (its own thread and llama.cpp context);
requests for the same model share its slots. A request holds a reference on its model from `acquire` to
`release`: a model with requests in flight is never evicted or expired. Loads happen one at a time
(`acquire` blocks: call it off the event loop); unloads happen on the pool's reaper thread, never on the
thread that releases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional

from ..errors import LocalrunError, ModelNotFound, UsageError

FOREVER = -1.0  # keep_alive < 0: never expires (evicted only to make room, or by `stop`)


class ModelTooBig(LocalrunError):
    """A model whose estimate does not fit the memory budget even with every other model unloaded."""


class PoolBusy(LocalrunError):
    """Every loaded model is in use and the next one does not fit beside them: retry later."""


@dataclass(frozen=True)
class LoadSpec:
    """The load-time options (Ollama's api.Runner): a request asking for other values reloads the model."""

    ctx: Optional[int] = None  # per slot; None = the catalogue's context (or 4096)
    parallel: int = 4
    gpu_layers: str = "auto"
    flash_attn: Optional[bool] = None
    kv_type: str = "f16"
    threads: Optional[int] = None
    batch: int = 512
    kind: str = "batch"  # batch: the HTTP dialects' continuous batching; run: run/chat's request path, one at a time

    def check(self) -> None:
        """Refuse bad values before any model loads (the same messages loading would give)."""
        from ..engine.model import LoadOptions, parse_gpu_layers

        parse_gpu_layers(self.gpu_layers)
        if self.batch < 1:
            raise UsageError(f"invalid --batch {self.batch}: use 1 or more")
        if self.parallel < 1:
            raise UsageError(f"invalid --parallel {self.parallel}: use 1 or more")
        if self.parallel > self.batch:
            raise UsageError(f"--parallel {self.parallel} needs --batch of at least {self.parallel} (one token per sequence per step)")
        LoadOptions(n_ctx=(self.ctx or 4096) * self.parallel, n_threads=self.threads, flash_attn=self.flash_attn, kv_type=self.kv_type)

    def differences(self, other: "LoadSpec") -> list[str]:
        mine, theirs = asdict(self), asdict(other)
        return [f"{k} {mine[k]} -> {theirs[k]}" for k in mine if mine[k] != theirs[k]]


def parse_keep_alive(value: Any) -> float:
    """Seconds from a keep_alive as Ollama takes it: a number of seconds, or a duration "90s", "5m", "1h",
    "1h30m"; negative = forever, 0 = unload after the answer."""
    if isinstance(value, bool):
        raise UsageError(f"invalid keep-alive {value!r}: use seconds or a duration like 5m, 0 or -1")
    if isinstance(value, (int, float)):
        return FOREVER if value < 0 else float(value)
    text = str(value).strip().lower()
    try:
        seconds = float(text)
        return FOREVER if seconds < 0 else seconds
    except ValueError:
        pass
    import re

    parts = re.fullmatch(r"(-)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    if not text or parts is None or not any(parts.groups()[1:]):
        raise UsageError(f"invalid keep-alive {value!r}: use seconds or a duration like 5m, 0 or -1")
    sign, h, m, s = parts.groups()
    seconds = float(h or 0) * 3600 + float(m or 0) * 60 + float(s or 0)
    return FOREVER if sign else seconds


def estimate_bytes(path: Path, spec: LoadSpec, ref: Optional[str] = None) -> int:
    """What a model takes loaded with `spec`: weights plus KV for every slot at its context (gguf_info, as
    `show` reports), plus llama.cpp's logits buffer (vocabulary x batch floats, which that estimate leaves
    out and which dominates for gemma-3's 262k vocabulary)."""
    from .. import hub
    from ..engine.gguf_info import memory_estimate, read_info

    info = read_info(path)
    entry = hub.entry_for(ref or str(path))  # the catalogue's context, when `ref` is an alias
    ctx = spec.ctx or (entry.context if entry else 4096)
    total = memory_estimate(info, ctx * spec.parallel, spec.kv_type)["total_bytes"]
    return total + (info.vocab_size or 0) * 4 * spec.batch


def pulled_models() -> list[tuple[str, str]]:
    """(name a request may use, file) for every pulled model whose files are all there."""
    from .. import hub

    return [(m.ref, str(m.path)) for m in hub.list_local() if not m.missing_files()]


def available_memory() -> int:
    """RAM the kernel can hand out now (MemAvailable), the room a new model's weights and KV go into."""
    import psutil

    return int(psutil.virtual_memory().available)


class Resident:
    """One loaded model: its engine (via `loaded`), its scheduler, and how long it stays."""

    def __init__(self, loaded, scheduler, spec: LoadSpec, *, path: Path, estimate: int, slot_ctx: int, pinned: bool):
        self.loaded = loaded
        self.engine = loaded.engine
        self.scheduler = scheduler
        self.spec = spec
        self.path = path
        self.estimate = estimate
        self.slot_ctx = slot_ctx
        self.pinned = pinned  # named on `serve`'s command line: no expiry
        self.refs = 0
        self.keep_alive = FOREVER if pinned else 0.0
        self.expires: Optional[float] = None  # time.time() when idle and not pinned
        self.last_used = time.monotonic()
        self.loaded_at = time.time()
        self.names = {loaded.name.casefold(), loaded.ref.casefold(), str(path).casefold()}
        self.served = 0  # requests that took a reference: the first one paid the load

    @property
    def name(self) -> str:
        return self.loaded.name

    def describe(self) -> dict[str, Any]:
        """What `ps` shows (Ollama's /api/ps fields, plus the slots)."""
        on_gpu = self.engine.gpu_fraction()
        expires = None if self.expires is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.expires))
        return {
            "name": self.name, "model": self.loaded.ref, "path": str(self.path), "size": self.estimate,
            "size_vram": int(self.estimate * on_gpu), "processor": _processor(on_gpu),
            "context_length": self.slot_ctx, "slots": len(self.scheduler.slots),
            "slots_busy": len(self.scheduler.slots) - self.scheduler.idle_slots(), "requests": self.refs,
            "expires_at": expires, "keep_alive": None if self.keep_alive < 0 else self.keep_alive,
            "load": asdict(self.spec),
        }


def _processor(on_gpu: float) -> str:
    if on_gpu <= 0:
        return "100% CPU"
    if on_gpu >= 1:
        return "100% GPU"
    gpu = round(on_gpu * 100)
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


class ModelPool:
    """The models a server holds. `acquire(ref, spec)` → a Resident with a reference taken; `release`
    gives it back with the request's keep-alive."""

    def __init__(
        self,
        *,
        make_scheduler: Callable[[Any, int, LoadSpec], Any],
        load: Callable[[str, LoadSpec], Any],
        keep_alive: float = 300.0,
        max_models: int = 0,
        memory_budget: Optional[int] = None,
        on_notice: Callable[[str], None] = lambda message: None,
        clock: Callable[[], float] = time.time,
    ):
        self.make_scheduler = make_scheduler  # (loaded, slot_ctx, spec) -> a started Scheduler
        self.load_model = load  # (ref, spec) -> Loaded
        self.keep_alive = keep_alive
        self.max_models = max_models  # 0 = no cap but memory
        self.memory_budget = memory_budget  # None = free RAM at each load
        self.notice = on_notice
        self.clock = clock
        self.residents: list[Resident] = []
        self.lock = threading.Condition()
        self.loading = threading.Lock()  # one load at a time: two loads would each count the same free RAM
        self.closed = False
        self.reaper = threading.Thread(target=self._reap, name="localrun-keepalive", daemon=True)
        self.reaper.start()

    # -- requests ---------------------------------------------------------------------------------

    def find(self, ref: str) -> Optional[Resident]:
        """The resident model `ref` names as a request spelled it (name, alias, path), if any."""
        wanted = ref.casefold()
        with self.lock:
            for resident in self.residents:
                if wanted in resident.names:
                    return resident
        return None

    def acquire(self, ref: str, spec: LoadSpec, *, pinned: bool = False) -> Resident:
        """The resident model for `ref` with these load options, loading (and evicting) as needed, with a
        reference taken. Blocks for a load. Raises ModelNotFound, ModelTooBig, PoolBusy or the load's own
        error; a failure touches no other model."""
        resident = self._take(ref, spec)
        if resident is not None:
            return resident
        with self.loading:
            resident = self._take(ref, spec)  # loaded by a request that held the lock before us
            if resident is not None:
                return resident
            path = self._path(ref)
            with self.lock:
                same_file = [r for r in self.residents if r.path == path]
                for resident in same_file:
                    if resident.spec == spec and not resident.scheduler.fatal:  # the same model, named another way
                        resident.names.add(ref.casefold())
                        return self._hold(resident)
                for old in same_file:
                    # Same file, other load-time options: reload it, as Ollama does, once it is idle.
                    while old.refs > 0 and old in self.residents:
                        self.lock.wait(timeout=1)
                    if old in self.residents:
                        self.notice(f"reloading {old.name}: {', '.join(old.spec.differences(spec))}")
                        self._unload(old)
            estimate = estimate_bytes(path, spec, ref)
            self._make_room(estimate)
            loaded = self.load_model(ref, spec)
            try:
                slot_ctx = loaded.engine.n_ctx // spec.parallel
                scheduler = self.make_scheduler(loaded, slot_ctx, spec)
            except BaseException:
                loaded.close()
                raise
            resident = Resident(loaded, scheduler, spec, path=path, estimate=estimate, slot_ctx=slot_ctx, pinned=pinned)
            resident.names.add(ref.casefold())
            with self.lock:
                resident.refs, resident.served = 1, 1
                self.residents.append(resident)
                self.lock.notify_all()
            return resident

    def release(self, resident: Resident, keep_alive: Optional[float] = None) -> None:
        """The request is done with `resident`; it stays `keep_alive` seconds after its last request (the
        server's default when None; 0 unloads it now, on the reaper thread)."""
        with self.lock:
            resident.refs -= 1
            resident.last_used = time.monotonic()
            if not resident.pinned or keep_alive is not None:
                resident.keep_alive = self.keep_alive if keep_alive is None else keep_alive
            if resident.refs == 0:
                resident.expires = None if resident.keep_alive < 0 else self.clock() + resident.keep_alive
            self.lock.notify_all()

    def stop(self, ref: Optional[str] = None) -> list[str]:
        """Unload `ref` (every model when None) once its requests finish; the names unloaded."""
        with self.lock:
            chosen = list(self.residents) if ref is None else [r for r in self.residents if ref.casefold() in r.names]
            if ref is not None and not chosen:
                raise ModelNotFound(f"model {ref!r} is not loaded")
            for resident in chosen:
                resident.pinned = False
                resident.keep_alive = 0.0
                resident.expires = self.clock() if resident.refs == 0 else None
            self.lock.notify_all()
        return [r.name for r in chosen]

    def ps(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.describe() for r in sorted(self.residents, key=lambda r: -r.last_used)]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            chosen = list(self.residents)
            self.residents.clear()
            self.lock.notify_all()
        for resident in chosen:
            _close(resident)
        self.reaper.join(timeout=5)

    def busy(self) -> bool:
        with self.lock:
            return any(r.refs for r in self.residents)

    def request_stop(self) -> None:
        """Shutting down: every scheduler ends its open requests at once (see Scheduler.request_stop)."""
        with self.lock:
            for resident in self.residents:
                resident.scheduler.request_stop()

    # -- inside -------------------------------------------------------------------------------------

    def _take(self, ref: str, spec: LoadSpec) -> Optional[Resident]:
        wanted = ref.casefold()
        with self.lock:
            for resident in self.residents:
                if wanted in resident.names and resident.spec == spec and not resident.scheduler.fatal:
                    return self._hold(resident)
        return None

    @staticmethod
    def _hold(resident: Resident) -> Resident:
        """Take a reference (the lock held): no expiry while a request uses it."""
        resident.refs += 1
        resident.served += 1
        resident.expires = None
        resident.last_used = time.monotonic()
        return resident

    def _path(self, ref: str) -> Path:
        from .. import hub

        return hub.resolve_local(ref).path

    def _make_room(self, estimate: int) -> None:
        """Unload idle models, least recently used first, until `estimate` fits beside the rest."""
        with self.lock:
            while True:
                held = sum(r.estimate for r in self.residents)
                budget = self.memory_budget if self.memory_budget is not None else available_memory() + held
                if estimate > budget:
                    raise ModelTooBig(
                        f"the model needs about {_gib(estimate)} (weights and KV at this context) but "
                        f"{'the memory budget is' if self.memory_budget is not None else 'this machine has'} "
                        f"{_gib(budget)} even with every other model unloaded: use a smaller --ctx or quant"
                    )
                over_count = self.max_models and len(self.residents) >= self.max_models
                if not over_count and held + estimate <= budget:
                    return
                idle = [r for r in self.residents if r.refs == 0]
                if not idle:
                    raise PoolBusy(
                        f"every loaded model is answering a request and the next one does not fit beside them "
                        f"({len(self.residents)} loaded, {_gib(held)} held): retry shortly"
                    )
                victim = min(idle, key=lambda r: r.last_used)
                self.notice(f"unloading {victim.name} to make room")
                self._unload(victim)

    def _unload(self, resident: Resident) -> None:
        """Called with the lock held; the scheduler thread is idle (no references), so closing is quick."""
        self.residents.remove(resident)
        self.lock.notify_all()
        _close(resident)

    def _reap(self) -> None:
        """Unload models whose keep-alive ran out (checked on each release and stop, and every second)."""
        with self.lock:
            while not self.closed:
                now = self.clock()
                for resident in [r for r in self.residents if r.refs == 0 and r.expires is not None and r.expires <= now]:
                    self._unload(resident)
                self.lock.wait(timeout=1.0)


def _close(resident: Resident) -> None:
    resident.scheduler.stop()
    resident.loaded.close()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
