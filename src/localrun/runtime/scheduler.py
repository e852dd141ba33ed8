"""Continuous batching: many generation requests served from one model and one llama.cpp context.

One thread owns the context. Each step it puts one plain-sampling task per running request into the
engine's one batched step (engine.loop.step): the next token of every decoding sequence plus a bounded
chunk of the prompts still being prefilled, decoded together; each sequence then samples from its own
logits row with its own C sampler chain. A sequence that finishes (end of text, a stop sequence, max
tokens, a full slot, or its client gone) leaves the batch at once and its slot takes the next waiting
request at the following step.

Slots keep the tokens left in their KV sequence after a request, and a new request goes to the free slot
sharing the longest prefix with it; a longer prefix held by any other slot (the same system prompt, a
document asked about again) is copied into it (engine.kv.reuse_from), so only the new tokens are evaluated.

The HTTP side never touches llama.cpp: it hands `Job`s in and gets responses back through `deliver`,
called once per step with every job's new responses (one cross-thread wake-up per step, not per token).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from ..engine import Engine, Response
from ..engine.loop import Plain, step
from ..engine.kv import common_prefix
from ..engine.model import Batch, DecodeError
from ..engine.sampling import Sampler
from ..engine.sequence import Sequence


@dataclass
class Job:
    """One request inside the scheduler: its sequence (prompt, limits, output), sampler and progress."""

    seq: Sequence
    sampler: Sampler
    sink: object = None  # opaque to the scheduler: where `deliver` routes this job's responses
    on_done: object = None  # opaque to the scheduler: what the deliverer calls with the final response
    tools: object = None  # opaque to the scheduler: how the dialect reads tool calls in the answer
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: bool = False
    # scheduler thread only
    slot: Optional["Slot"] = None
    task: Optional[Plain] = None

    @property
    def prompt(self) -> list[int]:
        return self.seq.prompt

    @classmethod
    def create(cls, engine: Engine, prompt: list[int], sampling, *, max_tokens: int, n_ctx: int,
               top_logprobs: Optional[int] = None) -> "Job":
        """A job for `prompt`: its sampler chain is built here (a bad grammar or logit bias fails in the
        caller's thread, before anything is queued); its time to first token counts from now.
        `top_logprobs`: report each token's log-probability and that many alternatives'."""
        sampler = Sampler(engine, sampling)
        seq = Sequence(engine, prompt, sampling, seq_id=-1, n_ctx=n_ctx, max_tokens=max_tokens)
        seq.top_logprobs = top_logprobs
        return cls(seq, sampler)


@dataclass
class Slot:
    seq_id: int
    job: Optional[Job] = None
    last_used: float = 0.0


@dataclass
class StepStats:
    """What the last steps did, for /metrics (read without a lock: plain ints and floats)."""

    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        *,
        parallel: int,
        slot_ctx: int,
        max_waiting: int,
        prefill_chunk: int,
        deliver: Callable[[list[tuple[Job, Response]]], None],
        on_step: Optional[Callable[[int, int], None]] = None,
    ):
        self.engine = engine
        engine.use_raw_logits()  # each request's own chain (grammar, penalties) reads its slot's logits
        self.slot_ctx = slot_ctx
        self.max_waiting = max_waiting
        self.deliver = deliver
        self.on_step = on_step  # (batch tokens, running sequences) after each decode
        self.slots = [Slot(i) for i in range(parallel)]
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []  # in admission order: earlier prompts prefill first
        self.cond = threading.Condition()
        self.stopping = False
        self.stats = StepStats()
        self.capacity = max(engine.n_batch, parallel)
        # Room for every slot's decode token beside one full chunk, or a prompt could wait forever.
        self.prefill_chunk = max(1, min(max(1, prefill_chunk), self.capacity - parallel))
        self.batch: Optional[Batch] = Batch(self.capacity)
        self.thread = threading.Thread(target=self._run, name="localrun-scheduler", daemon=True)
        self.fatal: Optional[str] = None

    # -- called from other threads --------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the waiting queue is full (the caller answers 429). A job that an idle
        slot will take at the next step does not count as waiting (so --queue 0 still serves)."""
        with self.cond:
            if self.fatal or self.stopping:
                return False
            if len(self.waiting) >= self.max_waiting + self.idle_slots():
                return False
            self.waiting.append(job)
            self.stats.waiting = len(self.waiting)
            self.cond.notify()
        return True

    def cancel(self, job: Job) -> None:
        """The client went away: the job leaves the batch at the next step (its sampler is freed there)."""
        with self.cond:
            job.cancelled = True
            self.cond.notify()

    def request_stop(self) -> None:
        """Begin stopping without waiting: open requests end at once with 'the server is shutting down'
        (called from the signal handler, on the event loop that must still deliver those ends)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def stop(self) -> None:
        self.request_stop()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        if self.batch is not None and not self.thread.is_alive():
            self.batch.close()
            self.batch = None

    def idle_slots(self) -> int:
        return sum(1 for s in self.slots if s.job is None)

    # -- the scheduler thread -------------------------------------------------------------------

    def _run(self) -> None:
        out: list[tuple[Job, Response]] = []
        try:
            while True:
                with self.cond:
                    while not self.stopping and not self.running and not self.waiting:
                        self.cond.wait()
                    if self.stopping:
                        break
                    self._drop_cancelled(out)
                    self._admit()
                if self.running:
                    self._step(out)
                if out:
                    self.deliver(out)
                out = []
        except BaseException as exc:  # noqa: BLE001 - a dead scheduler must fail every request, loudly
            self.fatal = f"the scheduler stopped: {type(exc).__name__}: {exc}"
            raise
        finally:
            with self.cond:
                leftovers = list(self.running) + list(self.waiting)
                self.running.clear()
                self.waiting.clear()
            # Responses of this step not yet delivered (a failure mid-step), then every job still open.
            reason = "error" if self.fatal else "shutdown"
            out += [(job, self._finish(job, reason, self.fatal or "the server is shutting down: retry later")) for job in leftovers]
            if out:
                self.deliver(out)

    def _drop_cancelled(self, out: list) -> None:
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            out.append((job, self._finish(job, "cancelled")))
        for job in [j for j in self.running if j.cancelled]:
            out.append((job, self._finish(job, "cancelled")))

    def _admit(self) -> None:
        while self.waiting:
            free = [s for s in self.slots if s.job is None]
            if not free:
                break
            job = self.waiting.popleft()
            self._assign(job, free)
            self.running.append(job)
        self.stats.waiting = len(self.waiting)
        self.stats.running = len(self.running)

    def _assign(self, job: Job, free: list[Slot]) -> None:
        """Give `job` the free slot with the longest shared prefix (a longer one held by any slot is copied)."""
        kv, prompt = self.engine.kv, job.prompt
        limit = len(prompt) - 1  # the last prompt token is always evaluated: its logits are sampled
        slot = max(free, key=lambda s: (min(common_prefix(kv.tokens[s.seq_id], prompt), limit), -s.last_used))
        kept = kv.reuse_from(slot.seq_id, prompt, [s.seq_id for s in self.slots])
        slot.job, job.slot = slot, slot
        job.seq.seq_id = slot.seq_id
        job.task = Plain(self.engine, job.seq, job.sampler, chunk=self.prefill_chunk, reused=kept)
        job.task.job = job

    def _step(self, out: list) -> None:
        # Decoding sequences in slot order (llama.cpp splits a batch whose sequences come out of order into
        # several ubatches), then prompt chunks in admission order.
        decoding = sorted((j for j in self.running if j.task.next_token is not None), key=lambda j: j.slot.seq_id)
        prefilling = [j for j in self.running if j.task.next_token is None]
        try:
            results = step(self.engine, self.batch, [j.task for j in decoding + prefilling])
        except DecodeError as exc:
            for task in exc.tasks:
                self.engine.kv.clear(task.job.slot.seq_id)
                out.append((task.job, self._finish(task.job, "error", f"llama.cpp decode failed (code {exc.rc})")))
            return
        if not self.batch.n:
            return
        for task, response in results:
            out.append((task.job, response))
            if response.done:
                self._release(task.job)
        self.stats.running = len(self.running)
        self.stats.kv_tokens = self.engine.kv.held()
        if self.on_step is not None:
            self.on_step(self.batch.n, len(decoding))

    def _finish(self, job: Job, reason: str, error: Optional[str] = None) -> Response:
        """End a job that did not finish by itself (cancelled, failed, shutting down)."""
        response = job.task.interrupt(reason, error) if job.task is not None else job.seq.finish(reason, error=error)
        self._release(job)
        return response

    def _release(self, job: Job) -> None:
        """Free the job's slot and sampler; the slot keeps its tokens for prefix reuse."""
        if job in self.running:
            self.running.remove(job)
        slot = job.slot
        if slot is not None:
            slot.job = None
            slot.last_used = time.perf_counter()
            job.slot = None
        job.sampler.close()
        self.stats.running = len(self.running)
