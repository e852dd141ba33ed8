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

from ..errors import UsageError
from .scheduler import StepStats

# The fields of a run request on the wire (localrun's own /api/run), besides model, load and keep_alive.
RUN_FIELDS = ("messages", "raw", "system", "truncate", "session", "use_cache")


class Exclusive:
    """One request at a time on a model loaded for run/chat (its requests wait their turn)."""

    def __init__(self) -> None:
        self.turn = threading.Lock()
        self.slots = [None]
        self.stats = StepStats()
        self.fatal: Optional[str] = None
        self.stopping = False

    def idle_slots(self) -> int:
        return 0 if self.turn.locked() else 1

    def request_stop(self) -> None:
        self.stopping = True

    def stop(self) -> None:
        """Wait for the request in progress (it sees `stopping` at its next token) before the model closes."""
        self.stopping = True
        with self.turn:
            pass


def answer(resident, payload: dict[str, Any], *, fresh: bool, on_notice: Callable[[str], None],
           cancelled: Callable[[], bool]) -> Iterator:
    """Answer a run request on `resident` (a model the pool loaded with an Exclusive runner). `fresh`: loaded
    for this request (its load time is reported; otherwise 0, as the model was already there)."""
    from ..engine import merge_options
    from .generate import generate
    from .request import Request

    unknown = set(payload) - set(RUN_FIELDS) - {"sampling"}
    if unknown:
        raise UsageError(f"unknown run request field {sorted(unknown)[0]!r}")
    loaded, runner = resident.loaded, resident.scheduler
    sampling = merge_options(loaded.defaults, payload.get("sampling") or {})
    request = Request(sampling=sampling, **{k: payload[k] for k in RUN_FIELDS if k in payload})
    with runner.turn:
        runner.stats.running = 1
        try:
            for response in generate(loaded, request, on_notice=on_notice, cancelled=lambda: cancelled() or runner.stopping):
                if response.done and not fresh and response.stats is not None:
                    response.stats.load_s = 0.0
                yield response
        finally:
            runner.stats.running = 0
