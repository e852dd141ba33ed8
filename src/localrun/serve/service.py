"""What every route of one server shares: its options (`ServeOptions`, from `serve`'s command line) and the
`Service` they make: the model pool (each resident model with its scheduler), the metrics, the names the models
answered to, the Responses API's stored responses and the conversations whose answer a client stopped."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from ..runtime import Loaded
from ..runtime.loader import load
from ..runtime.options import FOREVER, SERVER_SLOTS, LoadSpec
from ..runtime.request import TemplateDefaults
from ..runtime.serving.pool import ROOM_WAIT_S, ModelPool, Resident, pull_if_needed
from ..runtime.serving.runner import start_scheduler
from ..runtime.workers import fail_over_lost_workers
from .guards import max_body_bytes
from .metrics import Metrics
from .stored import Kept


@dataclass
class ServeOptions:
    spec: LoadSpec = field(default_factory=lambda: LoadSpec(parallel=SERVER_SLOTS))  # the server's load-time options (requests may differ)
    max_waiting: int = 64
    prefill_chunk: int = 256
    api_keys: tuple[str, ...] = ()  # a request needs one of them (none: no key); serve.guards
    origins: tuple[str, ...] = ()  # the browser origins allowed besides the loopback ones (serve.cors)
    ssl_certfile: Optional[str] = None  # TLS: uvicorn's, with ssl_keyfile
    ssl_keyfile: Optional[str] = None
    max_body: int = field(default_factory=max_body_bytes)  # bytes; 0: no cap (serve/guards.py)
    model: Optional[str] = None  # the model named on the command line: loaded at start, the default
    aliases: tuple[str, ...] = ()  # what it answers to besides its own names, the alphabetically first the one listed (--alias)
    sampling: Optional[dict] = None  # the sampling flags given to serve, over each model's catalogue defaults
    keep_alive: float = 300.0
    max_models: int = 0
    memory_budget: Optional[int] = None
    source: str = "auto"
    exit_when_idle: Optional[float] = None  # the resident server: exit after this long with no model loaded
    socket: bool = False  # the resident server: on its Unix socket, speaking localrun's own /api/run too
    quiet: bool = False  # no access log (one line per request on stderr)
    # what every chat request that says nothing else is answered with (--reasoning, --reasoning-effort, --chat-template-kwargs)
    template_defaults: TemplateDefaults = field(default_factory=TemplateDefaults)


class Service:
    """What the routes share: the model pool (each resident model with its scheduler) and the metrics."""

    def __init__(self, options: ServeOptions, on_notice=None):
        self.options = options
        self.created = int(time.time())
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.metrics = Metrics()
        self.pool = ModelPool(
            make_scheduler=self._scheduler, load=self._load, keep_alive=options.keep_alive,
            max_models=options.max_models, memory_budget=options.memory_budget,
            on_notice=on_notice or (lambda message: None),
            # The resident server does not make a run wait for room: its client answers in its own process at once.
            room_wait=0.0 if options.socket else ROOM_WAIT_S,
        )
        self.metrics.watch(self.pool)
        fail_over_lost_workers(self.pool)  # a lost RPC worker fails its model's requests, not the server
        self.stopping = False
        self.exit = lambda: None  # ends the HTTP server (set by `serve`)
        self.inflight = 0
        self.counting = threading.Lock()
        self.last_activity = time.monotonic()
        # Every name a loaded model answered to -> what loads it again: a name /api/ps or /v1/models listed
        # (a path model's file name) still works after the model unloads (an eject, its keep-alive).
        self.known: dict[str, str] = {}
        self.served: Optional[str] = None  # what loads the command line's model: pinned again when reloaded
        self.served_name: Optional[str] = None  # the name it is listed by, loaded or not (ejected)
        self.stored = Kept()  # the Responses API's responses, for previous_response_id and GET /v1/responses/{id}
        self.cancels: set[str] = set()  # conversations (localrun's /api/converse) whose answer the client asked to stop

    def served_unloaded(self) -> bool:
        """The command line's model is not loaded now (ejected): still listed, as it is still served."""
        return self.served is not None and not any(r.loaded.ref == self.served for r in list(self.pool.residents))

    @property
    def alias(self) -> Optional[str]:
        """The name the command line's model is listed and answers by (--alias; llama-server's first of its set)."""
        return min(self.options.aliases) if self.options.aliases else None

    def is_served(self, resident: Resident) -> bool:
        return self.served is not None and resident.loaded.ref == self.served

    def name_of(self, resident: Resident) -> str:
        """The name an answer of `resident` that names no model says it came from: the alias, for the served model."""
        return self.alias if self.alias and self.is_served(resident) else resident.name

    def remember(self, resident: Resident) -> None:
        if self.alias and self.is_served(resident):
            # listed (/v1/models, /api/ps, /props) by its alias, as llama-server; still answering to its own names
            resident.names |= {a.casefold() for a in self.options.aliases}
            resident.listed = [self.alias]
        for name in list(resident.names):
            self.known[name] = resident.loaded.ref

    def deleted(self, ref: str) -> list[tuple[str, bool]]:
        """Model `ref` was deleted (or replaced by a create or copy of its name): unloaded where it is loaded as
        itself (runtime.serving.pool.deleted), and its names name nothing any more. The pool's (name, still answering)."""
        for name in [n for n, r in self.known.items() if r.casefold() == ref.casefold() or n == ref.casefold()]:
            del self.known[name]
        return self.pool.deleted(ref)

    def alias_named(self, name: str) -> Optional[str]:
        """The --alias that `name` is (as a request names a model: any case, Ollama's clients add :latest), or None."""
        wanted = name.casefold()
        return next((a for a in self.options.aliases if a.casefold() in (wanted, wanted.removesuffix(":latest"))), None)

    def resolve(self, name: str) -> str:
        """What a request's model name loads: a loaded model's ref by any of its names, else a name a model
        answered to before it unloaded, else the name as given."""
        wanted = name.casefold()
        if self.served and self.alias_named(name):
            return self.served
        loaded = next((r.loaded.ref for r in list(self.pool.residents) if wanted in r.names), None)
        return loaded or self.known.get(wanted, name)

    def activity(self, delta: int) -> None:
        """A run request began (+1) or ended (-1): the resident server is idle only with none in flight."""
        with self.counting:
            self.inflight += delta
            self.last_activity = time.monotonic()

    def end_if_idle(self, after: float = 0.0) -> bool:
        """Start stopping unless a request is in flight (checked with the count held, so none slips in);
        with `after`, only once no model has been loaded nor any request made for that long."""
        with self.counting:
            if self.inflight or self.pool.busy():
                return False
            if after and (self.pool.residents or time.monotonic() - self.last_activity <= after):
                return False
            self.stopping = True
        return True

    def end(self) -> None:
        """Stop serving: open requests end at once, then the HTTP server exits (exit status 0)."""
        self.stopping = True
        self.pool.request_stop()
        self.exit()

    def _load(self, ref: str, spec: LoadSpec) -> Loaded:
        loaded = load(ref, spec, source=self.options.source, sampling=self.options.sampling if spec.kind == "batch" else None)
        loaded.template_defaults = self.options.template_defaults
        return loaded

    def _scheduler(self, loaded: Loaded, slot_ctx: int, spec: LoadSpec):
        return start_scheduler(loaded, slot_ctx, spec, max_waiting=self.options.max_waiting,
                               prefill_chunk=self.options.prefill_chunk, on_step=self.metrics.step)

    def preload(self) -> Resident:
        """The command line's model, loaded before the port opens (a bad one fails `serve` itself)."""
        pull_if_needed(self.options.model, self.options.source)  # as `serve ALIAS` always did
        resident, _ = self.pool.acquire(self.options.model, self.options.spec, pinned=True)
        self.pool.release(resident, keep_alive=FOREVER)
        self.served, self.served_name = resident.loaded.ref, self.alias or resident.name
        self.remember(resident)
        return resident
