"""What a server runs a loaded model on: its continuous-batching scheduler (runtime.serving.scheduler), started and warmed
for the HTTP dialects, or an embeddings context's one turn at a time (runtime.serving.resident.Exclusive). The model pool
(runtime.serving.pool.ModelPool) calls `start_scheduler` for each model it loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ..options import LoadSpec
from .resident import Exclusive
from .scheduler import Job, Scheduler


def start_scheduler(loaded, slot_ctx: int, spec: LoadSpec, *, max_waiting: int, prefill_chunk: int,
                    on_step: Optional[Callable[[int, int], None]] = None):
    """A started scheduler of `spec.parallel` slots of `slot_ctx` tokens on `loaded`'s engine (each request waits in
    its own thread for a slot: Scheduler.hold), or for an embeddings context its turn keeper."""
    if spec.kind == "embed":
        return Exclusive()
    engine = loaded.engine
    scheduler = Scheduler(
        engine, parallel=spec.parallel, slot_ctx=slot_ctx, max_waiting=max_waiting, prefill_chunk=prefill_chunk,
        on_step=on_step, deliver=_deliver, lookup=loaded.decoding.draft_max if loaded.decoding.draft == "lookup" else 0,
    )
    scheduler.start()
    if spec.kind == "batch":  # the HTTP dialects' first request as fast as the next, as llama-server's
        # The end-of-generation tokens that ignore_eos and min_tokens ban: a walk over the vocabulary (0.12 s
        # for gemma's 262k tokens), and a first decode, on the thread that decodes from now on.
        engine.eog_tokens()
        scheduler.call(engine.warm_up)
    return scheduler


def _deliver(responses: list[tuple[Job, object]]) -> None:
    """Straight to the jobs' own queues, read by their requests' threads (runtime.serving.scheduler.SlotSeat)."""
    for job, response in responses:
        job.sink.put_nowait(response)
