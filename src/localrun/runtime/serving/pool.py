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

import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

from ...errors import ConfigError, LocalrunError, ModelNotFound, Phrase
from ..memory import available_memory, estimate_breakdown, estimate_bytes, gpu_free_bytes, gpu_share  # noqa: F401
from ..options import FOREVER, LoadSpec

NEVER_S = (2**63 - 1) / 1e9  # Go's longest time.Duration: what Ollama adds to now for a model that never expires
RELOAD_WAIT_S = 120.0  # how long a reload waits for the requests still using the model's other options
ROOM_WAIT_S = 120.0  # how long a load waits for a model answering requests to finish them and make room


class ModelTooBig(LocalrunError):
    """A model whose estimate does not fit the memory budget even with every other model unloaded."""


class PoolBusy(LocalrunError):
    """Every loaded model is in use and the next one does not fit beside them: retry later."""


class LoadCancelled(LocalrunError):
    """The request went away while its load waited for room."""


def model_key(resident: Resident, name: Optional[str] = None) -> str:
    """What makes two residents one model: their file, unless one is a created model (its name then: `name`, one
    of the names it is listed by)."""
    return f"created:{name or resident.loaded.name}" if _made(resident.loaded) else str(resident.path)


def _made(loaded) -> bool:
    """Whether a loaded model is a created one (runtime.models.create)."""
    return getattr(getattr(loaded, "brought", None), "made", False)


def _same_model(loaded, brought) -> bool:
    """Whether a loaded model answers for a name that brings `brought`: yes, unless either is a created
    model (its own system prompt, parameters, template) and they differ."""
    made = getattr(loaded, "made", False) or getattr(brought, "made", False)
    return not made or loaded == brought


def _brought(ref: str):
    from ... import hub

    return hub.defaults_for(ref)


def _registered_name(ref: str) -> str:
    """A created model's name as it is registered (pirate-2 for PIRATE-2:latest)."""
    from ... import hub

    return hub.record_ref(ref) or ref


def pull_if_needed(ref: str, source: str, on_progress: Optional[Callable[[str, Optional[int], int], None]] = None) -> None:
    """Pull `ref` when it is not here: the model named on `serve`'s command line (requests never pull), and
    Ollama's /api/pull (`on_progress` hears each file's bytes instead of a bar on stderr). A damaged file is
    fetched again, as `localrun pull` does."""
    from ... import hub
    from ...errors import IntegrityError

    try:
        hub.ensure_local(ref, source=source, progress=on_progress or True)
    except IntegrityError:
        hub.pull(ref, source=source, progress=on_progress or True)


def remove_pulled(ref: str) -> list[Path]:
    """Delete a pulled model's files (`localrun rm`); ModelNotFound when it is not pulled."""
    from ... import hub

    return hub.remove(ref)


def pulled_refs() -> list[tuple[str, str]]:
    """(name a request may use, file) for every pulled model whose files are all there."""
    return [(m.ref, str(m.path)) for m in listed_local() if not m.missing_files()]


def listed_local() -> list:
    """The pulled and made models, for a server's model lists: none, with a warning in its log, where the
    registry is damaged (the lists still answer with what is loaded; a request naming one says the reason)."""
    from ... import hub

    try:
        return hub.list_local()
    except ConfigError as exc:
        if exc.message not in _SAID:  # once per damage, not at every request
            _SAID.add(exc.message)
            print(f"warning: the pulled models are left out of the model list: {exc.message}", file=sys.stderr, flush=True)
        return []


_SAID: set = set()


class Resident:
    """One loaded model: its engine (via `loaded`), its scheduler, and how long it stays."""

    def __init__(self, loaded, scheduler, spec: LoadSpec, *, path: Path, estimate: int, slot_ctx: int, pinned: bool,
                 vram: int = 0, memory: Optional[dict[str, int]] = None):
        self.loaded = loaded
        self.engine = loaded.engine
        self.scheduler = scheduler
        self.spec = spec
        self.path = path
        self.estimate = estimate
        self.memory = memory or {"total_bytes": estimate}  # the estimate by what holds it (estimate_breakdown)
        self.vram = vram  # of the estimate, what its layers on a GPU take there
        self.slot_ctx = slot_ctx
        self.pinned = pinned  # named on `serve`'s command line: no expiry
        self.refs = 0
        self.keep_alive = FOREVER if pinned else 0.0
        self.expires: Optional[float] = None  # time.time() when idle and not pinned
        self.last_used = time.monotonic()
        self.names = {loaded.name.casefold(), loaded.ref.casefold()}
        if not _made(loaded):  # a created model is not its file under another name
            self.names.add(str(path).casefold())
        # The names ps lists it by: its own, and a created model's copies that share this load (cp pirate pirate-2,
        # run both: one load, two names, as Ollama lists each name loaded).
        self.listed: list[str] = [loaded.name]
        self.retiring = False  # being stopped or reloaded: no new requests, unloaded when the last one ends
        self.yielding = False  # a load waits for its room: no new requests (ModelPool._make_room unloads it)
        self.stamp: tuple[int, int] = (-1, -1)  # the file's size and mtime when loaded
        from ...engine.llama import CpuLoad

        self.machine = CpuLoad()  # how busy other processes keep the CPUs between its requests (runtime.serving.resident)
        self.told_busy = False  # a run at a terminal heard that the machine is busy (once, until it calms down)
        self.conversations: "OrderedDict[str, Any]" = OrderedDict()  # the chats kept on it (runtime.serving.resident)

    def usable(self, stamp: tuple[int, int]) -> bool:
        """May a new request use it: not being retired, not failed, and still the file on disk."""
        return not self.retiring and not self.yielding and not self.scheduler.fatal and stamp == self.stamp

    @property
    def name(self) -> str:
        return self.loaded.name

    def describe(self, name: Optional[str] = None) -> dict[str, Any]:
        """What `ps` shows (Ollama's /api/ps fields, plus the slots), listed by `name` (one of `listed`)."""
        from datetime import datetime

        from ...store.digests import file_digest
        from ..models.details import model_details

        on_gpu = self.engine.gpu_fraction()
        # Always a time, as Ollama writes it (clients parse it as a date): in use, its keep-alive from now;
        # never expiring, Ollama's far future (now plus the longest Go duration, some 292 years).
        if self.expires is not None:
            expires_s = self.expires
        else:
            expires_s = time.time() + (NEVER_S if self.keep_alive < 0 else self.keep_alive)
        expires = datetime.fromtimestamp(expires_s).astimezone().isoformat(timespec="seconds")
        name = name or self.name
        return {
            "name": name, "model": name, "path": str(self.path), "size": self.estimate,
            "digest": file_digest(self.path, wait=False) or "", "details": model_details(self.engine.info),
            "size_vram": self.vram or int(self.estimate * on_gpu), "processor": _processor(on_gpu),
            "context_length": self.slot_ctx, "slots": len(self.scheduler.slots), "threads": getattr(self.engine, "n_threads", None),
            "slots_busy": len(self.scheduler.slots) - self.scheduler.idle_slots(), "requests": self.refs,
            "expires_at": expires, "keep_alive": None if self.keep_alive < 0 else self.keep_alive,
            # (the adapters it was loaded with: a created model's ADAPTER lines, then --lora's; the spec has only these)
            "load": {**asdict(self.spec), "lora": [list(a) for a in self.engine.options.lora]},
            "memory": dict(self.memory),
        }


_PER_CONTEXT = ("size", "size_vram", "processor", "context_length", "slots", "slots_busy", "requests", "expires_at",
                "keep_alive", "load", "memory", "threads")


def _as_loaded(spec: LoadSpec) -> LoadSpec:
    """`spec` as the pool compares loads: threads as many as the default are the default (a --threads N and no
    --threads load the same; they used to reload the model between them)."""
    from ...engine.llama import default_threads

    return replace(spec, threads=None) if spec.threads == default_threads() else spec


def _processor(on_gpu: float) -> str:
    if on_gpu <= 0:
        return "100% CPU"
    if on_gpu >= 1:
        return "100% GPU"
    gpu = round(on_gpu * 100)
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


class Loading:
    """A load under way: what `ps` lists while llama.cpp reads the model (it listed nothing for the seconds a
    model of a gigabyte took, while the server grew by it)."""

    def __init__(self, ref: str, path: Path, spec: LoadSpec, memory: dict[str, int], vram: int):
        self.ref, self.path, self.spec, self.memory, self.vram = ref, path, spec, memory, vram
        self.started = time.time()
        self.progress = 0.0

    def heard(self, fraction: float) -> None:
        self.progress = fraction

    def describe(self) -> dict[str, Any]:
        """`ps`'s row for it: what its load will hold (the estimate), how far llama.cpp has read it."""
        from ...engine.gguf_info import read_info
        from ...engine.llama import default_threads
        from ..models.details import model_details

        from ... import hub

        name = hub.record_ref(self.ref) or self.path.name  # as it is listed once loaded (a file: by its name)
        size = self.memory.get("total_bytes", 0)
        on_gpu = self.vram / size if size else 0.0
        return {
            "name": name, "model": name, "path": str(self.path), "size": size, "digest": "",
            "details": model_details(read_info(self.path)), "size_vram": self.vram, "processor": _processor(on_gpu),
            "context_length": None, "slots": self.spec.parallel, "slots_busy": 0, "requests": 1, "expires_at": None,
            "keep_alive": None, "load": asdict(self.spec), "memory": dict(self.memory),
            "threads": self.spec.threads or default_threads(),
            "loading": {"progress": round(self.progress, 3), "seconds": round(time.time() - self.started, 1)},
        }


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
        free_vram: Optional[Callable[[], Optional[int]]] = None,
        on_notice: Callable[[str], None] = lambda message: None,
        clock: Callable[[], float] = time.time,
        room_wait: float = ROOM_WAIT_S,
    ):
        self.make_scheduler = make_scheduler  # (loaded, slot_ctx, spec) -> a started Scheduler
        self.load_model = load  # (ref, spec) -> Loaded
        self.keep_alive = keep_alive
        self.max_models = max_models  # 0 = no cap but memory
        self.memory_budget = memory_budget  # None = free RAM at each load
        self.free_vram = free_vram or gpu_free_bytes  # free GPU memory now (None: no GPU)
        self.notice = on_notice
        self.clock = clock
        self.room_wait = room_wait
        self.stopping = False  # request_stop: no load waits for room any more
        self.residents: list[Resident] = []
        self.loads: list[Loading] = []  # the load under way (ps lists it, with its progress)
        self.lock = threading.Condition()
        self.loading = threading.Lock()  # one load at a time: two loads would each count the same free RAM
        self.closed = False
        self.reaper = threading.Thread(target=self._reap, name="localrun-keepalive", daemon=True)
        self.reaper.start()

    # -- requests ---------------------------------------------------------------------------------

    def acquire(self, ref: str, spec: LoadSpec, *, pinned: bool = False,
                cancelled: Optional[Callable[[], bool]] = None) -> tuple[Resident, float]:
        """The resident model for `ref` with these load options, loading (and evicting) as needed, with a
        reference taken; and the seconds this call spent loading it or waiting for a load (0.0: it was loaded
        already; a request that waited for another's load of its model says so, as Ollama's load_duration
        does). Blocks for a load. Raises ModelNotFound, ModelTooBig, PoolBusy, LoadCancelled (`cancelled()`
        turned true while it waited for room) or the load's own error; a failure touches no other model."""
        spec = _as_loaded(spec)
        resident = self._find(ref, spec)
        if resident is not None:
            return resident, 0.0
        started = time.monotonic()
        with self.loading:
            waited = time.monotonic() - started  # for another request's load (of this model's file, perhaps)
            resident = self._find(ref, spec)  # loaded by a request that held the lock before us
            if resident is not None:
                return resident, max(1e-6, waited)
            path = self._path(ref)
            stamp = _stamp(path)
            brought = _brought(ref)
            gpu_free = self.free_vram()  # first: it loads llama.cpp, which must come before gguf's numpy (engine.llama)
            memory = estimate_breakdown(path, spec, ref)
            estimate = memory["total_bytes"]
            if spec.rpc:  # the offloaded layers go to the workers first: only the rest counts here (in RAM)
                estimate -= int(estimate * gpu_share(path, spec.gpu_layers, True))
                vram = 0
            else:
                vram = int(estimate * gpu_share(path, spec.gpu_layers, gpu_free is not None))
            closing: list[Resident] = []
            try:
                with self.lock:
                    self._check_fits_alone(estimate, vram, gpu_free)  # before anything is unloaded for it
                    # A model loaded for another kind of request (run/chat, batched slots, embeddings) stays.
                    # Another name for the same file with other defaults (a created model, its base) is another model.
                    same_file = [r for r in self.residents if r.path == path and r.spec.kind == spec.kind
                                 and _same_model(getattr(r.loaded, "brought", None), brought)]
                    for resident in same_file:
                        if resident.spec == spec and resident.usable(stamp):  # the same model, named another way
                            resident.names.add(ref.casefold())
                            if brought.made:  # a copy of a created model: listed by its own name too
                                listed = _registered_name(ref)
                                if listed.casefold() not in {n.casefold() for n in resident.listed}:
                                    resident.listed.append(listed)
                            # No load of its own: the time it waited for another's (a copy's source loading) is
                            # its load time; what was looked at to find it (the file's size and memory estimate,
                            # slow on a busy machine) is not.
                            return self._hold(resident), waited if waited > 0.05 else 0.0
                    # Same file, other load-time options (or changed on disk): reload it, as Ollama does, once
                    # its requests are done; new ones no longer go to it meanwhile.
                    deadline = time.monotonic() + RELOAD_WAIT_S
                    carried: set[str] = set()  # a reload keeps the model's names and its pin
                    for old in same_file:
                        carried |= old.names
                        pinned = pinned or old.pinned
                        old.retiring = True
                        while old.refs > 0 and old in self.residents and time.monotonic() < deadline:
                            self.lock.wait(timeout=0.5)
                        if old.refs > 0:
                            raise PoolBusy(f"{old.name} is still answering with its other load options: retry shortly")
                        if old in self.residents:
                            changed = old.spec.differences(spec) or ["the file changed on disk"]
                            self.notice(f"reloading {old.name}: {', '.join(changed)}")
                            closing.append(self._remove(old))
                    closing += self._make_room(estimate, vram, gpu_free, freed=(
                        sum(r.estimate - r.vram for r in closing), sum(r.vram for r in closing)), cancelled=cancelled)
                    if self.stopping or self.closed:  # nothing loads for a server that is ending
                        raise PoolBusy("the server is shutting down: retry later")
            finally:
                for resident in closing:
                    _close(resident)
            loading = Loading(ref, path, spec, memory, vram)
            with self.lock:
                self.loads.append(loading)
            from ...engine.llama import load_progress

            try:
                heard = load_progress.set(loading.heard)  # llama.cpp's progress, for ps (engine.model.Engine)
                try:
                    loaded = self.load_model(ref, spec)
                finally:
                    load_progress.reset(heard)
                try:
                    slot_ctx = loaded.engine.n_ctx // spec.kv_streams(loaded.engine.info)  # a slot's stream, or the pool they share
                    scheduler = self.make_scheduler(loaded, slot_ctx, spec)
                except BaseException:
                    loaded.close()
                    raise
                resident = Resident(loaded, scheduler, spec, path=path, estimate=estimate, slot_ctx=slot_ctx, pinned=pinned,
                                    vram=vram, memory=memory)
                resident.stamp = stamp
                resident.names |= carried | {ref.casefold()}
                with self.lock:
                    resident.refs = 1
                    self.residents.append(resident)
                    self.loads.remove(loading)  # (in one step: ps sees it loading or loaded)
                    self.lock.notify_all()
                return resident, max(1e-6, time.monotonic() - started)
            except BaseException:
                with self.lock:
                    if loading in self.loads:
                        self.loads.remove(loading)
                raise

    def release(self, resident: Resident, keep_alive: Optional[float] = None) -> None:
        """The request is done with `resident`; it stays `keep_alive` seconds after its last request (the
        server's default when None; 0 unloads it now, on the reaper thread; a model being stopped or
        reloaded goes whatever the request asked)."""
        with self.lock:
            resident.refs -= 1
            resident.last_used = time.monotonic()
            if resident.retiring:
                resident.keep_alive = 0.0
            elif not resident.pinned or keep_alive is not None:
                resident.keep_alive = self.keep_alive if keep_alive is None else keep_alive
            if resident.refs == 0:
                resident.expires = None if resident.keep_alive < 0 else self.clock() + resident.keep_alive
            self.lock.notify_all()

    def stop(self, ref: Optional[str] = None) -> list[tuple[str, bool]]:
        """Unload `ref` (every model when None) once its requests finish: (name, still answering) each. A name
        that shares its load with others ps lists (a created model and its copy) only leaves the list: the load
        stays for them."""
        with self.lock:
            forms = set() if ref is None else {ref.casefold(), ref.casefold().removesuffix(":latest")}  # as ps lists it
            chosen = list(self.residents) if ref is None else [r for r in self.residents if forms & r.names]
            if ref is not None and not chosen:
                raise ModelNotFound(f"model {ref!r} is not loaded")
            dropped: list[str] = []
            retiring: list[Resident] = []
            for resident in chosen:
                names = self._unlist(resident, forms) if ref is not None else []
                dropped += names
                if not names:
                    retiring.append(resident)
            return [(name, False) for name in dropped] + self._retire(retiring)

    def _unlist(self, resident: Resident, forms: set[str]) -> list[str]:
        """(the lock held) Take the names in `forms` off a load listed by others too; the names taken off. A load
        listed by that name alone is left to be retired."""
        mine = [n for n in resident.listed if n.casefold() in forms]
        if not mine or len(mine) == len(resident.listed):
            return []
        resident.listed = [n for n in resident.listed if n not in mine]
        resident.names -= forms | {n.casefold() for n in mine}
        return mine

    def deleted(self, name: str) -> list[tuple[str, bool]]:
        """Model `name` was deleted: loaded as itself, it is unloaded once its requests finish; a model that
        only answered to it too (the same file and options: a copy of it, or what it is a copy of) keeps
        serving under its own names, no longer this one. (name, still answering) of each unloaded."""
        wanted = name.casefold()
        forms = {wanted, wanted.removesuffix(":latest")} | ({wanted + ":latest"} if ":" not in wanted else set())
        with self.lock:
            chosen = [r for r in self.residents if r.loaded.ref.casefold() in forms]
            for resident in self.residents:
                if resident not in chosen:
                    resident.names -= forms
                    resident.listed = [n for n in resident.listed if n.casefold() not in forms] or resident.listed
            return self._retire(chosen)

    def _retire(self, chosen: list[Resident]) -> list[tuple[str, bool]]:
        """(the lock held) Unload `chosen` once their requests finish."""
        for resident in chosen:
            resident.pinned, resident.retiring = False, True
            resident.keep_alive = 0.0
            resident.expires = self.clock() if resident.refs == 0 else None
        self.lock.notify_all()
        return [(name, r.refs > 0) for r in chosen for name in r.listed]  # by the names ps lists

    def abandon(self, endpoints: list[str], message: str) -> None:
        """RPC workers were lost mid-generation: the models split over them fail their open requests with
        `message` and leave the pool (their memory is not freed: a thread is stuck inside llama.cpp there);
        the other models keep serving."""
        from ...engine.rpc import parse_endpoints

        with self.lock:
            gone = [self._remove(r) for r in list(self.residents) if set(parse_endpoints(r.spec.rpc)) & set(endpoints)]
        for resident in gone:
            self.notice(f"dropped {resident.name}: {message}")
            abandon = getattr(resident.scheduler, "abandon", None)
            if abandon is not None:
                abandon(message)

    def ps(self) -> list[dict[str, Any]]:
        """Each loaded model once, as Ollama lists it, most recently used first. A model loaded for chat and
        for embeddings (or for run) holds a llama.cpp context for each: its size, slots and requests are
        their sums, the rest (context_length, processor, load) is the most recently used generating context's
        (an embeddings context's only where it has no other: Open WebUI reads a chat model's context length
        here), and `contexts` lists each. A model being loaded comes last, with `loading` (how far llama.cpp has
        read it, and for how long)."""
        with self.lock:
            residents = sorted(self.residents, key=lambda r: -r.last_used)
            order: dict[str, int] = {}  # each model at its most recent use
            for resident in residents:
                order.setdefault(model_key(resident), len(order))
            # (sorted is stable: within a model, generating contexts first, each kind most recent first; a load
            # listed by several names, a row each)
            rows = [(r.describe(name), model_key(r, name)) for r in sorted(residents, key=lambda r: (order[model_key(r)], r.spec.kind == "embed"))
                    for name in r.listed]
            rows += [(loading.describe(), f"loading:{loading.path}") for loading in self.loads]
        models: dict[str, dict[str, Any]] = {}
        for row, key in rows:
            context = {"kind": row["load"]["kind"], **{k: row[k] for k in _PER_CONTEXT}}
            model = models.get(key)
            if model is None:
                models[key] = {**row, "contexts": [context]}
                continue
            model["contexts"].append(context)
            for key in ("size", "size_vram", "slots", "slots_busy", "requests"):
                model[key] += row[key]
            model["memory"] = {k: model["memory"].get(k, 0) + v for k, v in row["memory"].items()}  # each context loads its own
            for key in ("expires_at", "keep_alive"):  # the latest (None: never)
                model[key] = None if None in (model[key], row[key]) else max(model[key], row[key])
        return list(models.values())

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
        """Shutting down: every scheduler ends its open requests at once (see Scheduler.request_stop), and a load
        waiting for room gives up."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
            for resident in self.residents:
                resident.scheduler.request_stop()

    def stepping(self) -> bool:
        """Whether a scheduler's thread still runs: after request_stop, it is finishing the step under way (a long
        prompt's chunk may take seconds), and then ends its requests (an abandoned one never returns: not counted)."""
        with self.lock:
            schedulers = [r.scheduler for r in self.residents]
        return any(getattr(s, "thread", None) is not None and s.thread.is_alive() and not s.fatal for s in schedulers)

    # -- inside -------------------------------------------------------------------------------------

    def take(self, ref: str, spec: LoadSpec) -> Optional[Resident]:
        """The model for `ref` with these options, with a reference taken, if it is loaded; else None. Never
        waits for a load (the lock guards only the list): the event loop asks it before `acquire`."""
        return self._find(ref, _as_loaded(spec))

    def _find(self, ref: str, spec: LoadSpec) -> Optional[Resident]:
        wanted = ref.casefold()
        with self.lock:
            for resident in self.residents:
                if wanted in resident.names and resident.spec == spec and resident.usable(_stamp(resident.path)):
                    return self._hold(resident)
        return None

    @staticmethod
    def _hold(resident: Resident) -> Resident:
        """Take a reference (the lock held): no expiry while a request uses it."""
        resident.refs += 1
        resident.expires = None
        resident.last_used = time.monotonic()
        return resident

    def _path(self, ref: str) -> Path:
        from ... import hub

        return hub.resolve_local(ref).path

    def _make_room(self, estimate: int, vram: int, gpu_free: Optional[int], freed: tuple[int, int] = (0, 0),
                   cancelled: Optional[Callable[[], bool]] = None) -> list[Resident]:
        """Take idle models off the list, least recently used first, until `estimate` (of which `vram` on
        the GPU) fits beside the rest, in RAM and in GPU memory (the lock held); the caller closes them
        after letting the lock go. `freed` (RAM, VRAM): taken off already, to be closed, so still in use as
        far as free memory goes. Where every model is answering, the load waits (up to room_wait) for the least
        recently used one to finish: new requests no longer go to it (they queue behind this load, as Ollama
        queues a request for a model that needs room), and it is unloaded when its last request ends."""
        removed: list[Resident] = []
        deadline, waited_for = time.monotonic() + self.room_wait, None
        while True:
            out = (freed[0] + sum(r.estimate - r.vram for r in removed), freed[1] + sum(r.vram for r in removed))
            ram_budget, vram_budget = self._budgets(gpu_free, out)
            ram_held = sum(r.estimate - r.vram for r in self.residents)
            vram_held = sum(r.vram for r in self.residents)
            over_count = self.max_models and len(self.residents) >= self.max_models
            fits_gpu = vram_budget is None or vram_held + vram <= vram_budget
            if not over_count and ram_held + estimate - vram <= ram_budget and fits_gpu:
                if waited_for is not None:
                    waited_for.yielding = False  # room was found elsewhere: it stays
                return removed
            idle = [r for r in self.residents if r.refs == 0]
            gone = not idle and cancelled is not None and cancelled()
            if not idle and time.monotonic() < deadline and not gone and not self.stopping:
                if waited_for is None or waited_for not in self.residents:
                    waited_for = min((r for r in self.residents if not r.retiring), key=lambda r: r.last_used, default=None)
                    if waited_for is not None:  # (not `retiring`: a stop or rm meanwhile keeps its own meaning)
                        waited_for.yielding = True
                        self.notice(f"waiting for {waited_for.name} to finish its requests, to make room")
                self.lock.wait(timeout=0.5)
                if gpu_free is not None:  # a model the keep-alive reaper closed meanwhile gave its GPU memory back
                    gpu_free = self.free_vram()
                continue
            if not idle:
                if waited_for is not None:
                    waited_for.yielding = False  # it stays: the load that wanted its room gave up
                self.residents.extend(removed)  # nothing is unloaded for a load that cannot happen now
                if gone:
                    raise LoadCancelled("the request went away while its model waited for room")
                if self.stopping:
                    raise PoolBusy("the server is shutting down: retry later")
                why = (f"{len(self.residents)} of at most {self.max_models} models are loaded" if over_count else
                       f"the next one does not fit beside them ({_gib(ram_held)} held, {_gib(ram_budget)} in all)" if fits_gpu else
                       f"the next one does not fit beside them in GPU memory ({_gib(vram_held)} held, {_gib(vram_budget)} in all)")
                raise PoolBusy(f"every loaded model is answering a request and {why}: retry shortly")
            victim = min(idle, key=lambda r: r.last_used)
            self.notice(f"unloading {victim.name} to make room")
            removed.append(self._remove(victim))

    def _budgets(self, gpu_free: Optional[int], freed: tuple[int, int] = (0, 0)) -> tuple[int, Optional[int]]:
        """What the loaded models may take in all, in RAM and on the GPU (None: no GPU) (the lock held): RAM
        is --memory-budget, else free RAM plus what the loaded models and those `freed` (taken off, not yet
        closed) hold; the GPU's, its free memory plus what they hold there."""
        ram = self.memory_budget if self.memory_budget is not None else (
            available_memory() + sum(r.estimate - r.vram for r in self.residents) + freed[0])
        vram = None if gpu_free is None else gpu_free + sum(r.vram for r in self.residents) + freed[1]
        return ram, vram

    def _check_fits_alone(self, estimate: int, vram: int, gpu_free: Optional[int]) -> None:
        """ModelTooBig when `estimate` (of which `vram` on the GPU) exceeds a budget even with every model
        unloaded (the lock held)."""
        ram_budget, vram_budget = self._budgets(gpu_free)
        if vram_budget is not None and vram > vram_budget:
            raise ModelTooBig(Phrase(
                "the model's layers on the GPU need about {need} (weights, KV and compute at this context) but the GPU"
                " has {free} free even with every other model unloaded: offload fewer layers ({gpu_layers}), or use a"
                " smaller context or quant", need=_gib(vram), free=_gib(vram_budget)))
        if estimate - vram > ram_budget:
            raise ModelTooBig(
                f"the model needs about {_gib(estimate - vram)} (weights, repacked copy, KV and compute at this context"
                f"{', besides its layers on the GPU' if vram else ''}) but "
                f"{'the memory budget is' if self.memory_budget is not None else 'this machine has'} "
                f"{_gib(ram_budget)} even with every other model unloaded: use a smaller context or quant"
            )

    def _remove(self, resident: Resident) -> Resident:
        """Take `resident` off the list (the lock held): no request can find it any more; close it after."""
        self.residents.remove(resident)
        self.lock.notify_all()
        return resident

    def _reap(self) -> None:
        """Unload models whose keep-alive ran out (checked on each release and stop, and every second); the
        closing happens outside the lock, so requests to other models never wait for it."""
        while True:
            with self.lock:
                if self.closed:
                    return
                now = self.clock()
                expired = [self._remove(r) for r in list(self.residents)
                           if r.refs == 0 and r.expires is not None and r.expires <= now]
                if not expired:
                    self.lock.wait(timeout=1.0)
            for resident in expired:
                _close(resident)


def _stamp(path: Path) -> tuple[int, int]:
    """What says the file is the one loaded: a pull, rm or re-quantize in place changes it."""
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def _close(resident: Resident) -> None:
    resident.scheduler.stop()
    resident.loaded.close()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
