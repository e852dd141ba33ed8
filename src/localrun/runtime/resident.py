"""`run` on a resident model: the request `localrun run` sends the resident server, answered by the same
request path a run in-process takes (runtime.generate: the session or prefix cache, the decode loop, the
save after), so that what the user sees is the same either way.

A model loaded for run/chat is held with one sequence; its requests take turns (`Exclusive` stands where a
Scheduler stands for the HTTP dialects' batched models, so the pool keeps, expires and evicts both alike).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Optional

from ..errors import LocalrunError, UsageError
from .scheduler import StepStats

# The fields of a run request on the wire (localrun's own /api/run), besides model, load and keep_alive.
RUN_FIELDS = ("messages", "raw", "system", "truncate", "session", "use_cache")


class ServerStopping(LocalrunError):
    """The server was stopped (stop --server, SIGTERM) while this answer was running."""


class Exclusive:
    """One request at a time on a model loaded for run/chat (its requests wait their turn)."""

    def __init__(self) -> None:
        self.turn = threading.Lock()
        self.slots = [None]
        self.stats = StepStats()
        self.fatal: Optional[str] = None
        self.stopping = False
        self.closed = False

    def idle_slots(self) -> int:
        return 0 if self.turn.locked() else 1

    def request_stop(self) -> None:
        self.stopping = True

    def stop(self) -> None:
        """Wait for the request in progress (it sees `stopping` at its next token); the ones still waiting
        for their turn find the model closed and fail, rather than touch a freed model."""
        self.stopping = True
        with self.turn:
            self.closed = True


def answer(resident, payload: dict[str, Any], *, fresh: bool, on_notice: Callable[[str], None],
           cancelled: Callable[[], bool]) -> Iterator:
    """Answer a run request on `resident` (a model the pool loaded with an Exclusive runner), as a run
    in-process would: with --no-cache the model starts from an empty context, as a freshly loaded one does.
    `fresh`: loaded for this request (its load time is reported; otherwise 0: it was already loaded)."""
    from ..engine import merge_options
    from .generate import generate
    from .request import Request

    unknown = set(payload) - set(RUN_FIELDS) - {"sampling"}
    if unknown:
        raise UsageError(f"unknown run request field {sorted(unknown)[0]!r}")
    loaded, runner = resident.loaded, resident.scheduler
    sampling = merge_options(loaded.defaults, payload.get("sampling") or {})
    request = Request(sampling=sampling, **{k: payload[k] for k in RUN_FIELDS if k in payload})
    if not runner.turn.acquire(blocking=False):
        on_notice(f"waiting for another run on {resident.name} to finish")
        runner.turn.acquire()
    try:
        if runner.closed or runner.stopping:
            raise ServerStopping("the localrun server is stopping: run again to start a new one")
        runner.stats.running = 1
        if not request.use_cache and not request.session:
            loaded.engine.kv.clear(0)
        for response in generate(loaded, request, on_notice=on_notice, cancelled=lambda: cancelled() or runner.stopping):
            if response.done and response.finish_reason == "interrupted" and runner.stopping and not cancelled():
                raise ServerStopping("the localrun server was stopped during the answer: run again to start a new one")
            if response.done and not fresh and response.stats is not None:
                response.stats.load_s = 0.0
            yield response
    finally:
        runner.stats.running = 0
        runner.turn.release()
