"""Continuous batching: many generation requests served from one model and one llama.cpp context.

One thread owns the context. Each step it builds one `llama_batch` holding the next token of every
running sequence plus a bounded chunk of the prompts still being prefilled, decodes it, then samples
each sequence from its own logits row with its own C sampler chain. A sequence that finishes (end of
text, a stop sequence, max tokens, a full slot, or its client gone) leaves the batch at once and its
slot takes the next waiting request at the following step.

Slots keep the tokens left in their KV sequence after a request, and a new request goes to the free
slot sharing the longest prefix with it; a longer prefix held by any other slot (the same system
prompt, a document asked about again) is copied with `llama_memory_seq_cp` in a unified KV pool,
so only the new tokens are evaluated.

The HTTP side never touches llama.cpp: it hands `Job`s in and gets events back through `deliver`,
called once per step with every job's new events (one cross-thread wake-up per step, not per token).
"""

from __future__ import annotations

import codecs
import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from .engine import Engine, common_prefix, llama_cpp_module
from .sampling import Sampler
from .stops import StopMatcher


@dataclass
class Job:
    """One request inside the scheduler: its prompt tokens, sampler, limits and progress."""

    prompt: list[int]
    sampler: Sampler
    max_tokens: int  # > 0
    stops: list[str]
    sink: object = None  # opaque to the scheduler: where `deliver` routes this job's events
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: bool = False
    # progress (scheduler thread only)
    slot: Optional["Slot"] = None
    n_prefilled: int = 0  # prompt tokens in the slot's KV so far
    cached_tokens: int = 0  # prompt tokens reused from a cache, not evaluated
    generated: list[int] = field(default_factory=list)
    next_token: Optional[int] = None  # sampled, to be decoded at the next step
    batch_index: int = -1
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: Optional[float] = None
    text_parts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.matcher = StopMatcher(self.stops)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")


@dataclass
class Piece:
    text: str


@dataclass
class Finish:
    reason: str  # stop | length | cancelled | error | shutdown
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    tpot_s: float
    error: Optional[str] = None


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what the KV sequence holds, in order
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
        deliver: Callable[[list[tuple[Job, object]]], None],
        on_step: Optional[Callable[[int, int], None]] = None,
    ):
        self.engine = engine
        engine.use_raw_logits()  # each request's own chain (grammar, penalties) reads its slot's logits
        self.ll = llama_cpp_module()
        self.slot_ctx = slot_ctx
        self.max_waiting = max_waiting
        self.prefill_chunk = max(1, prefill_chunk)
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
        self.prefill_chunk = max(1, min(self.prefill_chunk, self.capacity - parallel))
        self.batch = self.ll.llama_batch_init(self.capacity, 0, 1)
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
            self.ll.llama_batch_free(self.batch)
            self.batch = None

    def idle_slots(self) -> int:
        return sum(1 for s in self.slots if s.job is None)

    # -- the scheduler thread -------------------------------------------------------------------

    def _run(self) -> None:
        out: list[tuple[Job, object]] = []
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
            # Events of this step not yet delivered (a failure mid-step), then every job still open.
            out += [(job, self._finish(job, "error" if self.fatal else "shutdown", self.fatal or "the server is shutting down: retry later")) for job in leftovers]
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
        """Give `job` the free slot with the longest shared prefix; copy a longer one from any slot."""
        ll, mem = self.ll, self.engine.memory
        limit = len(job.prompt) - 1  # the last prompt token is always evaluated: its logits are sampled
        slot = max(free, key=lambda s: (min(common_prefix(s.tokens, job.prompt), limit), -s.last_used))
        keep = min(common_prefix(slot.tokens, job.prompt), limit)
        donor, donor_keep = None, keep
        for other in self.slots:
            if other is not slot:
                n = min(common_prefix(other.tokens, job.prompt), limit, len(other.tokens))
                if n > donor_keep:
                    donor, donor_keep = other, n
        if donor is not None:
            # A whole-sequence copy, then trim: per-slot KV streams only support copying a whole sequence.
            ll.llama_memory_seq_rm(mem, slot.seq_id, 0, -1)
            ll.llama_memory_seq_cp(mem, donor.seq_id, slot.seq_id, -1, -1)
            if ll.llama_memory_seq_rm(mem, slot.seq_id, donor_keep, -1):
                slot.tokens = donor.tokens[:donor_keep]
                keep = donor_keep
            else:  # a memory that cannot trim (recurrent): start from nothing
                ll.llama_memory_seq_rm(mem, slot.seq_id, 0, -1)
                slot.tokens, keep = [], 0
        elif not ll.llama_memory_seq_rm(mem, slot.seq_id, keep, -1):
            ll.llama_memory_seq_rm(mem, slot.seq_id, 0, -1)
            keep = 0
            slot.tokens = []
        del slot.tokens[keep:]
        slot.job = job
        job.slot = slot
        job.n_prefilled = keep
        job.cached_tokens = keep
        job.sampler.accept_prompt(job.prompt)  # repetition penalties see the prompt, as in `run`

    def _step(self, out: list) -> None:
        ll, batch = self.ll, self.batch
        n = 0
        # In slot order: llama.cpp splits a batch whose sequences come out of order into several ubatches.
        decoding = sorted((j for j in self.running if j.next_token is not None), key=lambda j: j.slot.seq_id)
        for job in decoding:
            slot = job.slot
            batch.token[n] = job.next_token
            batch.pos[n] = len(slot.tokens)
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = slot.seq_id
            batch.logits[n] = 1
            job.batch_index = n
            n += 1
        # Prompts go in chunks of at most prefill_chunk tokens, so a long prompt never stalls running
        # streams for long. A chunk's size depends only on its prompt (never on the load: a chunk that
        # does not fit waits a step), because llama.cpp's kernels round differently for other batch
        # shapes and a request's output must not depend on what else runs.
        chunks: list[tuple[Job, int]] = []
        for job in self.running:
            if job.next_token is not None:
                continue
            start = job.n_prefilled
            take = min(len(job.prompt) - start, self.prefill_chunk)
            if n + take > self.capacity:
                continue
            seq, pos0 = job.slot.seq_id, len(job.slot.tokens)
            for k in range(take):
                batch.token[n] = job.prompt[start + k]
                batch.pos[n] = pos0 + k
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = 0
                n += 1
            done = start + take == len(job.prompt)
            if done:
                batch.logits[n - 1] = 1
                job.batch_index = n - 1
            chunks.append((job, take))
        if n == 0:
            return
        batch.n_tokens = n
        rc = ll.llama_decode(self.engine.ctx, batch)
        if rc != 0:
            self._fail_batch(decoding + [j for j, _ in chunks], f"llama.cpp decode failed (code {rc})", out)
            return
        for job in decoding:
            job.slot.tokens.append(job.next_token)
            job.next_token = None
        sampling = list(decoding)
        for job, take in chunks:
            job.slot.tokens.extend(job.prompt[job.n_prefilled : job.n_prefilled + take])
            job.n_prefilled += take
            if job.n_prefilled == len(job.prompt):
                sampling.append(job)
        ctx = self.engine.ctx
        for job in sampling:
            self._sample(job, ctx, out)
        self.stats.running = len(self.running)
        self.stats.kv_tokens = sum(len(s.tokens) for s in self.slots)
        if self.on_step is not None:
            self.on_step(n, len(decoding))

    def _sample(self, job: Job, ctx, out: list) -> None:
        engine = self.engine
        tok = job.sampler.sample(ctx, len(job.generated), job.batch_index)
        if job.t_first is None:
            job.t_first = time.perf_counter()
        if engine.is_eog(tok):
            self._emit_finish(job, "stop", out)
            return
        job.generated.append(tok)
        text = job.matcher.feed(job.utf8.decode(engine.token_bytes(tok)))
        if text:
            job.text_parts.append(text)
            out.append((job, Piece(text)))
        if job.matcher.stopped is not None:
            self._emit_finish(job, "stop", out)
        elif len(job.generated) >= job.max_tokens or len(job.slot.tokens) + 1 >= self.slot_ctx:
            self._emit_finish(job, "length", out)  # max tokens, or the slot's context is full: never silent
        else:
            job.next_token = tok

    def _emit_finish(self, job: Job, reason: str, out: list) -> None:
        tail = job.matcher.feed(job.utf8.decode(b"", final=True)) if job.matcher.stopped is None else ""
        tail += job.matcher.flush()
        if tail:
            job.text_parts.append(tail)
            out.append((job, Piece(tail)))
        if job.matcher.stopped is not None:
            reason = "stop"
        out.append((job, self._finish(job, reason)))

    def _fail_batch(self, jobs: list[Job], message: str, out: list) -> None:
        for job in jobs:
            slot = job.slot
            self.ll.llama_memory_seq_rm(self.engine.memory, slot.seq_id, 0, -1)
            slot.tokens.clear()
            out.append((job, self._finish(job, "error", message)))

    def _finish(self, job: Job, reason: str, error: Optional[str] = None) -> Finish:
        """Release the job's slot and sampler; the slot keeps its tokens for prefix reuse."""
        if job in self.running:
            self.running.remove(job)
        slot = job.slot
        if slot is not None:
            slot.job = None
            slot.last_used = time.perf_counter()
            job.slot = None
        job.sampler.close()
        now = time.perf_counter()
        n = len(job.generated)
        ttft = (job.t_first - job.t_submit) if job.t_first is not None else 0.0
        tpot = (now - job.t_first) / (n - 1) if job.t_first is not None and n > 1 else 0.0
        self.stats.running = len(self.running)
        return Finish(reason, len(job.prompt), job.cached_tokens, n, ttft, tpot, error)
