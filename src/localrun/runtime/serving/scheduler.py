"""Continuous batching: many generation requests served from one model and one llama.cpp context.

One thread owns the context. Each step it puts one plain-sampling task per running request into the
engine's one batched step (engine.loop.step): the next token of every decoding sequence plus a bounded
chunk of the prompts still being prefilled, decoded together; each sequence then samples from its own
logits row with its own C sampler chain. A sequence that finishes (end of text, a stop sequence, max
tokens, a full slot, or its client gone) leaves the batch at once and its slot takes the next waiting
request at the following step.

Slots keep the tokens left in their KV sequence after a request, and a new request goes to the free slot
sharing the longest prefix with it (where that is more than the slot would throw away; else the least
recently used); a longer prefix held by any other slot (the same system prompt, a
document asked about again) is copied into it (engine.kv.reuse_from), so only the new tokens are evaluated.

The background server's slots share one KV pool of the context (engine LoadOptions.shared_kv; `serve`'s keep a
stream each): a request is admitted when its prompt fits beside what the running ones hold, and a step the pool
has no room for makes some (_make_room). A request alone first clears what idle slots kept, so that it answers
as in-process (_alone_in_pool).

`run` and `chat` on a resident server take a slot for a whole request (`hold`): the slot with the longest
prefix of the prompt, held while the request restores a session or prefix-cache state into it, generates
there with the other slots, and saves its state after (SlotSeat; the llama.cpp work of restoring and saving
runs on the scheduler thread between steps, through `call`).

The HTTP side never touches llama.cpp: it hands `Job`s in and gets responses back through `deliver`,
called once per step with every job's new responses (one cross-thread wake-up per step, not per token).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from ...engine import Engine, Response
from ...engine.loop import Plain, step
from ...engine.kv import common_prefix
from ...engine.lora import lora_key
from ...engine.model import Batch, DecodeError
from ...engine.sampling import Sampler
from ...engine.sequence import SequenceState
from ...engine.strategies import LookupDrafter, SpeculativeTask
from ...errors import EngineError, LocalrunError

# A request waits for another slot to finish evaluating a prefix they share when it is at least this long (a
# copy of a slot's KV stream costs far less than evaluating the tokens; a short one is not worth the wait).
PREFIX_WAIT = 64
SETTLE_S = 10.0  # stopping: how long the seats still held may use the scheduler thread (see Scheduler._settle)

@dataclass
class Job:
    """One request inside the scheduler: its sequence (prompt, limits, output), sampler and progress."""

    seq: SequenceState
    sampler: Sampler
    sink: object = None  # opaque to the scheduler: where `deliver` routes this job's responses
    on_done: object = None  # opaque to the scheduler: what the deliverer calls with the final response
    tools: object = None  # opaque to the scheduler: how the dialect reads tool calls in the answer
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: bool = False
    leased: Optional["Slot"] = None  # the slot a lease holds for it (run, chat); None: any free slot
    reuse: bool = True  # False: the slot starts empty (--no-cache), no prefix kept or copied
    draft_max: Optional[int] = None  # this request's cap on a lookup draft (0: none); None: the model's
    lora: tuple = ()  # the LoRA scales it is answered under, one per adapter of the model (engine.lora)
    # scheduler thread only
    slot: Optional["Slot"] = None
    task: Optional[Plain] = None

    @property
    def prompt(self) -> list[int]:
        return self.seq.prompt

    @property
    def lora_key(self) -> tuple:
        return lora_key(self.lora)

    @classmethod
    def create(cls, engine: Engine, prompt: list[int], sampling, *, max_tokens: int, n_ctx: int,
               top_logprobs: Optional[int] = None, draft_max: Optional[int] = None, lora: Optional[tuple] = None) -> "Job":
        """A job for `prompt`: its sampler chain is built here (a bad grammar or logit bias fails in the
        caller's thread, before anything is queued); its time to first token counts from now.
        `top_logprobs`: report each token's log-probability and that many alternatives'. `draft_max`: at
        most that many tokens drafted a step where the model drafts (0: this request decodes plainly). `lora`: the
        LoRA scales it is answered under (None: the model's default, engine.lora_defaults)."""
        sampler = Sampler(engine, sampling)
        seq = SequenceState(engine, prompt, sampling, seq_id=-1, n_ctx=n_ctx, max_tokens=max_tokens)
        seq.top_logprobs = top_logprobs
        return cls(seq, sampler, draft_max=draft_max, lora=tuple(engine.lora_defaults if lora is None else lora))


@dataclass
class Slot:
    seq_id: int
    job: Optional[Job] = None
    last_used: float = 0.0
    leased: bool = False  # held by a request between its jobs (see Scheduler.lease)

    @property
    def free(self) -> bool:
        return self.job is None and not self.leased


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
        lookup: int = 0,
    ):
        self.engine = engine
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
        # Prompt-lookup speculation: each decoding slot proposes up to `lookup` tokens that followed its last
        # few before (in its prompt or answer) and verifies them in the same step (engine.strategies).
        self.lookup = lookup
        decode_rows = parallel * (lookup + 1)
        self.capacity = max(engine.n_batch, decode_rows)
        # Room for every slot's decode tokens beside one full chunk, or a prompt could wait forever.
        self.prefill_chunk = max(1, min(max(1, prefill_chunk), self.capacity - decode_rows))
        self.batch: Optional[Batch] = Batch(self.capacity)
        self.thread = threading.Thread(target=self._run, name="localrun-scheduler", daemon=True)
        self.fatal: Optional[str] = None
        self.calls: collections.deque = collections.deque()  # (fn, result box, done event) for the scheduler thread
        self.waiters = 0  # requests waiting in `hold` for a free slot
        self.lora_turn: tuple = ()  # the LoRA scales (engine.lora_key) of the last step's jobs: the next set takes its turn

    # -- called from other threads --------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the waiting queue is full (the caller answers 429). A job that an idle
        slot will take at the next step does not count as waiting (so --queue 0 still serves)."""
        with self.cond:
            if self.fatal or self.stopping:
                return False
            if job.leased is None and len(self.waiting) >= self.max_waiting + self.idle_slots():
                return False
            self.waiting.append(job)
            self.stats.waiting = len(self.waiting)
            self.cond.notify_all()  # the scheduler thread and requests waiting for a slot share it
        return True

    def cancel(self, job: Job) -> None:
        """The client went away: the job leaves the batch at the next step (its sampler is freed there)."""
        with self.cond:
            job.cancelled = True
            self.cond.notify_all()  # the scheduler thread and requests waiting for a slot share it

    def request_stop(self) -> None:
        """Begin stopping without waiting: open requests end at once with 'the server is shutting down'
        (called from the signal handler, on the event loop that must still deliver those ends)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()  # the scheduler thread and requests waiting for a slot share it

    def abandon(self, message: str) -> None:
        """The scheduler thread is inside llama.cpp for good (an RPC worker was lost there): end every open
        request with `message` from this thread. The context is never freed (that thread still uses it)."""
        with self.cond:
            self.fatal = message
            jobs = list(self.running) + list(self.waiting)
            self.running.clear()
            self.waiting.clear()
            self.cond.notify_all()
        self.deliver([(job, job.seq.finish("error", error=message)) for job in jobs])

    def stop(self) -> None:
        if self.fatal and self.thread.is_alive():  # abandoned: nothing to wait for, nothing to free
            return
        self.request_stop()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        if self.batch is not None and not self.thread.is_alive():
            self.batch.close()
            self.batch = None

    @property
    def n_ctx(self) -> int:
        """The context of one slot: what one request may fill."""
        return self.slot_ctx

    def held(self, tokens: Sequence[int], key: Optional[tuple] = None) -> int:
        """The longest prefix of `tokens` a slot holds (read without the lock: a glance, not a promise), made
        under the LoRA scales `key` (engine.lora.lora_key; None: the model's default)."""
        kv = self.engine.kv
        key = lora_key(self.engine.lora_defaults) if key is None else key
        return max((common_prefix(list(kv.tokens[s.seq_id]), tokens) for s in self.slots if kv.matches(s.seq_id, key)), default=0)

    def idle_slots(self) -> int:
        return sum(1 for s in self.slots if s.free)

    @contextmanager
    def hold(self, tokens: Sequence[int] = (), *, on_wait: Optional[Callable[[], None]] = None,
             cancelled: Optional[Callable[[], bool]] = None, lora: Optional[Sequence[float]] = None) -> Iterator["SlotSeat"]:
        """Hold a slot for one request (waiting for one to be free: `on_wait` hears it once, and a request
        `cancelled` meanwhile stops waiting): the free slot sharing the longest prefix with `tokens`, else
        the least recently used. Raises ServerStopping once the server stops, QueueFull when `max_waiting`
        requests wait already (a request an idle slot takes at once never waits). `lora`: the LoRA scales
        the request is answered under (None: the model's default); a slot holding KV made under others is
        emptied for it."""
        scales = tuple(self.engine.lora_defaults if lora is None else (float(s) for s in lora))
        if len(scales) != len(self.engine.adapters):
            raise LocalrunError(f"{len(scales)} LoRA scales for a model with {len(self.engine.adapters)} adapters")
        key = lora_key(scales)
        told = waiting = False
        try:
            with self.cond:
                while True:
                    self._check_running()
                    free = [s for s in self.slots if s.free]
                    if free:
                        break
                    if cancelled is not None and cancelled():
                        raise LocalrunError("the request was cancelled while it waited for a free slot")
                    if not waiting:
                        if self.waiters >= self.max_waiting:
                            raise QueueFull(self.max_waiting)
                        waiting = True
                        self.waiters += 1
                    if on_wait is not None and not told:
                        told = True
                        on_wait()
                    self.cond.wait(timeout=0.25)
                slot = self._closest(free, tokens, key)
                slot.leased = True
        finally:
            if waiting:
                with self.cond:
                    self.waiters -= 1
        try:
            if self.engine.options.shared_kv:
                self.call(lambda: self._alone_in_pool(slot))
            if not self.engine.kv.matches(slot.seq_id, key):  # made under other LoRA scales: of no use to it
                self.call(lambda: self.engine.kv.clear(slot.seq_id))
            yield SlotSeat(self, slot, scales)
        finally:
            with self.cond:
                slot.leased = False
                slot.last_used = time.perf_counter()
                self.cond.notify_all()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the scheduler thread between two steps (llama.cpp work on a slot while others decode)
        and return what it returns (or raise what it raised)."""
        box: dict[str, Any] = {}
        done = threading.Event()
        with self.cond:
            if self.fatal or not self.thread.is_alive():  # stopping: still served while seats are held (_settle)
                raise ServerStopping(self.fatal)
            self.calls.append((fn, box, done))
            self.cond.notify_all()
        while not done.wait(timeout=1.0):
            if not self.thread.is_alive() or self.fatal:
                raise ServerStopping(self.fatal)
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _check_running(self) -> None:
        if self.fatal:
            raise ServerStopping(self.fatal)
        if self.stopping:
            raise ServerStopping()

    # -- the scheduler thread -------------------------------------------------------------------

    def _run(self) -> None:
        out: list[tuple[Job, Response]] = []
        try:
            while True:
                with self.cond:
                    while not self.stopping and not self.running and not self.waiting and not self.calls:
                        self.cond.wait()
                    if self.stopping:
                        break
                    calls, self.calls = self.calls, collections.deque()
                _answer_calls(calls)
                with self.cond:
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
                self.cond.notify_all()
            # Responses of this step not yet delivered (a failure mid-step), then every job still open.
            reason = "error" if self.fatal else "shutdown"
            out += [(job, self._finish(job, reason, self.fatal or "the server is shutting down: retry later")) for job in leftovers]
            if out:
                self.deliver(out)
            if not self.fatal:
                self._settle(SETTLE_S)
            with self.cond:
                calls, self.calls = self.calls, collections.deque()
                self.cond.notify_all()
            for _, box, done in calls:
                box["error"] = ServerStopping(self.fatal)
                done.set()

    def _settle(self, timeout: float) -> None:
        """Stopping: serve the calls of requests that still hold a seat (an answer that finished just before the
        stop reads its slot's state for the prefix cache) until every seat is given back, or `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                while not self.calls and any(s.leased for s in self.slots) and time.monotonic() < deadline:
                    self.cond.wait(timeout=0.05)
                if not self.calls:
                    return
                calls, self.calls = self.calls, collections.deque()
            _answer_calls(calls)

    def _drop_cancelled(self, out: list) -> None:
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            out.append((job, self._finish(job, "cancelled")))
        for job in [j for j in self.running if j.cancelled]:
            out.append((job, self._finish(job, "cancelled")))

    def _admit(self) -> None:
        for job in [j for j in self.waiting if j.leased is not None]:  # their slots are held for them
            if not self._room_for(job):
                continue
            self.waiting.remove(job)
            self._assign(job, [job.leased])
            self.running.append(job)
        later: list[Job] = []
        while self.waiting:
            free = [s for s in self.slots if s.free]
            if not free or not self._room_for(self.waiting[0]):
                break
            job = self.waiting.popleft()
            if job.reuse and self._prefix_coming(job):
                later.append(job)
                continue
            self._assign(job, free)
            self.running.append(job)
        self.waiting.extendleft(reversed(later))  # first in line again, in their order
        self.stats.waiting = len(self.waiting) + self.waiters
        self.stats.running = len(self.running)

    def _room_for(self, job: Job) -> bool:
        """Whether `job`'s prompt fits the slots' shared KV pool beside what the running requests hold or will
        hold of theirs (their answers' growth is met as it comes: _make_room); a job that would fit alone always
        does when nothing runs. A stream per slot: always."""
        if not self.engine.options.shared_kv or not self.running:
            return True
        kv = self.engine.kv
        held = sum(max(len(j.prompt), len(kv.tokens[j.slot.seq_id])) for j in self.running)
        return held + len(job.prompt) <= self.engine.n_ctx

    def _prefix_coming(self, job: Job) -> bool:
        """Whether a prompt still being evaluated in another slot shares more of `job`'s prompt (at least
        PREFIX_WAIT tokens more) than any slot holds now: then `job` waits until that prefix is in the KV and
        copies it, instead of evaluating the same tokens beside it (a burst of requests with one long system
        prompt, as agents and the tests' samplers send, evaluated it once per slot)."""
        kv, prompt, key = self.engine.kv, job.prompt, job.lora_key
        limit = len(prompt) - 1
        evaluating = [j for j in self.running if j.task is not None and j.task.next_token is None and not j.task.done
                      and j.lora_key == key]
        busy = {j.slot.seq_id for j in evaluating}
        held = max((min(common_prefix(kv.tokens[s.seq_id], prompt), limit) for s in self.slots
                    if s.seq_id not in busy and kv.matches(s.seq_id, key)), default=0)
        for other in evaluating:
            coming = min(common_prefix(other.prompt, prompt), limit)
            if coming - held >= PREFIX_WAIT and len(kv.tokens[other.slot.seq_id]) < coming:
                return True
        return False

    def _closest(self, free: list[Slot], tokens: Sequence[int], key: tuple = ()) -> Slot:
        """The slot among `free` beside the busy slots, then the one sharing the longest prefix with `tokens`
        (its last token never counts: it is always evaluated, its logits sampled), then the least recently
        used (an empty one first).

        Beside the busy slots first where each slot is a KV stream of its own (a sliding-window model's; slots
        sharing one pool go in one micro-batch in any order): llama.cpp puts only consecutive sequence ids in one micro-batch, so busy slots 0-3 decode in one pass over the weights and 0, 2, 5, 7
        in four (scripts/bench_slot_order.py), at every step for as long as they run together; a prefix held
        in another slot is copied from there as the job starts (engine.kv.reuse_from: a copy of one slot's
        KV stream, milliseconds), so taking the slot beside costs no prompt evaluation. A slot's prefix counts
        only where it is longer than what taking the slot throws away: a prompt that shares only `<bos>` or a
        first word with a slot takes another, and the prefix held there stays for its own next request.
        Token lists are copied: called from a request's thread, a running slot's list changes on the scheduler
        thread. `key`: the LoRA scales the tokens will be evaluated under: a slot made under others shares none."""
        kv, limit = self.engine.kv, max(0, len(tokens) - 1)
        busy = {s.seq_id for s in self.slots if not s.free} if kv.n_stream > 1 else set()  # one shared pool: any slot

        def rank(slot: Slot) -> tuple[int, int, float]:
            held = list(kv.tokens[slot.seq_id])
            shared = common_prefix(held, tokens) if kv.matches(slot.seq_id, key) else 0
            beside = (slot.seq_id - 1 in busy) + (slot.seq_id + 1 in busy)
            return beside, (min(shared, limit) if shared > len(held) - shared else 0), -slot.last_used

        return max(free, key=rank)

    def _assign(self, job: Job, free: list[Slot]) -> None:
        """Give `job` the free slot with the longest shared prefix (a longer one held by any slot is copied)."""
        kv, prompt = self.engine.kv, job.prompt
        slot = self._closest(free, prompt, job.lora_key)
        if job.reuse:
            kept = kv.reuse_from(slot.seq_id, prompt, [s.seq_id for s in self.slots], key=job.lora_key)
        else:
            kv.clear(slot.seq_id)
            kept = 0
        slot.job, job.slot = slot, slot
        job.seq.seq_id = slot.seq_id
        drafts = self.lookup if job.draft_max is None else min(self.lookup, job.draft_max)  # the rows reserved at most
        if drafts and job.seq.top_logprobs is None:  # logprobs: one row per token, plainly
            self.engine.use_raw_logits(slot.seq_id)  # it reads every drafted position's logits
            job.task = SpeculativeTask(self.engine, job.seq, job.sampler, LookupDrafter(), drafts,
                                       chunk=self.prefill_chunk, reused=kept)
        else:
            # The slot's backend top-k where the engine has one (a GPU) and the request's chain can start
            # from its candidates; raw logits for a chain that needs them all (grammar, penalties) or logprobs.
            k = job.sampler.prefilter if job.seq.top_logprobs is None else None
            prefilter = self.engine.prefilter_for(k, slot.seq_id)
            job.task = Plain(self.engine, job.seq, job.sampler, chunk=self.prefill_chunk, reused=kept, prefilter=prefilter)
        job.task.job = job

    def _this_step(self) -> list[Job]:
        """The running jobs that go into this step: those of one set of LoRA scales (llama.cpp applies adapters to
        a whole batch, as llama-server batches only slots whose adapters are equal), each set in its turn; that
        set applied to the context. Every job, where the model has no adapters."""
        if not self.engine.adapters:
            return list(self.running)
        keys = list(dict.fromkeys(j.lora_key for j in self.running))  # in admission order
        key = keys[(keys.index(self.lora_turn) + 1) % len(keys)] if self.lora_turn in keys and len(keys) > 1 else keys[0]
        jobs = [j for j in self.running if j.lora_key == key]
        self.engine.use_lora(jobs[0].lora)
        self.lora_turn = key
        return jobs

    def _step(self, out: list) -> None:
        # Decoding sequences in slot order (llama.cpp splits a batch whose sequences come out of order into
        # several ubatches), then prompt chunks in admission order.
        running = self._this_step()
        decoding = sorted((j for j in running if j.task.next_token is not None), key=lambda j: j.slot.seq_id)
        prefilling = [j for j in running if j.task.next_token is None and self._images_done(j, out)]
        while True:
            try:
                results = step(self.engine, self.batch, [j.task for j in decoding + prefilling])
                break
            except DecodeError as exc:
                if exc.rc != 1 or not self.engine.options.shared_kv:
                    for task in exc.tasks:
                        self.engine.kv.clear(task.job.slot.seq_id)
                        out.append((task.job, self._finish(task.job, "error", f"llama.cpp decode failed (code {exc.rc})")))
                    return
                decoding, prefilling = self._make_room(decoding, prefilling, out)  # the shared pool is full
                if not decoding and not prefilling:
                    with self.cond:  # a seat gives its cells back as its request ends (hold: notify_all)
                        self.cond.wait(timeout=0.05)
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

    def _alone_in_pool(self, slot: Slot) -> None:
        """(the scheduler thread) A request about to run in `slot` with no other slot in use: what the idle
        slots keep for prefix reuse leaves the shared pool first, so that its cells lie as they would in a
        context of its own, from the first cell on, and its greedy answer is the one `run --keep-alive 0`
        gives (in one pool, a sequence placed after another's cells sums its attention in another order, and a
        near-tie of two tokens can turn). A request beside others' running ones shares the pool as it is."""
        with self.cond:
            if self.running or self.waiting or any(s.leased or s.job is not None for s in self.slots if s is not slot):
                return
            for other in self.slots:
                if other is not slot and self.engine.kv.tokens[other.seq_id]:
                    self.engine.kv.clear(other.seq_id)

    def _make_room(self, decoding: list[Job], prefilling: list[Job], out: list) -> tuple[list[Job], list[Job]]:
        """The slots' shared KV pool has no room for the step (llama.cpp's decode returned 1, changing nothing):
        the jobs to try again with, once one thing made room. First what idle slots keep for prefix reuse (the
        least recently used), and what slots held for requests not yet admitted keep (two run or chat requests
        holding both slots of a full pool: one prefilled, the other waited for room its own slot's old tokens
        took, and each waited for the other for ever); then the prompts still being evaluated wait (the answers decoding beside them end
        and free their cells); then the answer holding the most cells ends as a full context does (`length`);
        prompts alone wait while a request that holds a slot between its jobs (saving its state) gives it back.
        (Prompts are admitted only with room for them beside the running ones, _room_for: one that still cannot
        fit beside other prompts fails, the last admitted.) Nothing to try again: wait a moment."""
        kv = self.engine.kv
        idle = [s for s in self.slots if s.free and kv.tokens[s.seq_id]]
        if idle:
            kv.clear(min(idle, key=lambda s: s.last_used).seq_id)
            return decoding, prefilling
        with self.cond:  # a slot held for a request still waiting to be admitted: what it kept is only a prefix
            queued = [j.leased for j in self.waiting if j.leased is not None]
        kept = [s for s in queued if s.job is None and kv.tokens[s.seq_id]]
        if kept:  # (waiting for it to be given back would wait forever: its request waits for this room)
            kv.clear(min(kept, key=lambda s: s.last_used).seq_id)
            return decoding, prefilling
        if decoding and prefilling:
            return decoding, []
        if decoding:
            longest = max(decoding, key=lambda j: len(kv.tokens[j.slot.seq_id]))
            out.append((longest, self._finish(longest, "length")))
            return [j for j in decoding if j is not longest], []
        if any(s.leased and s.job is None and kv.tokens[s.seq_id] for s in self.slots):
            return [], []  # a request between its jobs (saving its state) gives its slot back soon: wait for it
        last = prefilling[-1]
        kv.clear(last.slot.seq_id)
        out.append((last, self._finish(last, "error", f"the model's context of {self.engine.n_ctx} tokens, shared by its "
                                                      f"{len(self.slots)} slots, is full with other prompts: retry shortly")))
        return [], prefilling[:-1]

    def _images_done(self, job: Job, out: list) -> bool:
        """A prompt's prefill that reached an image evaluates it now, alone, before the step (llama.cpp decodes
        an image's embeddings in batches of their own): the other slots wait for one image, not a whole
        prompt. False when that failed: the job ends with llama.cpp's error, the others go on."""
        if not job.task.image_pending():
            return True
        try:
            job.task.evaluate_images()
            return True
        except LocalrunError as exc:
            self.engine.kv.clear(job.slot.seq_id)
            out.append((job, self._finish(job, "error", exc.message)))
            return False

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
        with self.cond:
            self.cond.notify_all()  # a request waiting for a slot (hold)


def _answer_calls(calls) -> None:
    """Run the calls other threads queued for the scheduler thread (Scheduler.call), each result or failure
    handed back to its caller."""
    for fn, box, done in calls:
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc
        done.set()


class ServerStopping(LocalrunError):
    """The server was stopped (stop --server, SIGTERM) while this request was waiting, or `during` its answer;
    or, with `failure`, its scheduler failed (the message says how)."""

    def __init__(self, failure: Optional[str] = None, *, during: bool = False):
        stopped = "the localrun server was stopped during the answer" if during else "the localrun server is stopping"
        super().__init__(failure or f"{stopped}: run again to start a new one")
        self.failure = failure


class QueueFull(LocalrunError):
    """Every slot is busy and `limit` requests wait already (the server's --queue): retry shortly."""

    def __init__(self, limit: int):
        super().__init__(f"the server is busy: {limit} requests are already waiting for a slot; retry shortly")
        self.limit = limit


class SlotSeat:
    """A slot held by one request (Scheduler.hold): runtime.sessions' seat, as the engine's own sequence is
    in-process, and where the request generates, batched with the other slots."""

    def __init__(self, scheduler: Scheduler, slot: Slot, lora: tuple = ()):
        self.scheduler = scheduler
        self.slot = slot
        self.kv = scheduler.engine.kv
        self.lora = lora  # the LoRA scales its request is answered under: what its KV is made, saved and restored under

    @property
    def tokens(self) -> list[int]:
        return self.kv.tokens[self.slot.seq_id]

    @property
    def n_ctx(self) -> int:
        return self.scheduler.slot_ctx

    # The state's rewriting between formats (engine.kv) happens here, in the request's thread: only
    # llama.cpp's own reading and writing holds up the other slots.
    def restore(self, data: bytearray, tokens: Sequence[int]) -> bool:
        ready = self.kv.for_this_context(data)
        return self.scheduler.call(lambda: self.kv.restore(ready, tokens, self.slot.seq_id, ready=True, made_with=lora_key(self.lora)))

    def state_bytes(self) -> bytearray:
        return self.kv.portable(self.scheduler.call(lambda: self.kv.state_bytes(self.slot.seq_id, raw=True)), self.slot.seq_id)

    def keep(self, n: int) -> None:
        """Hold only the first `n` tokens (what is saved as a conversation's must be only its own)."""
        if n < len(self.tokens):
            self.scheduler.call(lambda: self.kv.truncate(self.slot.seq_id, n))

    def reset(self) -> None:
        self.reuse = False  # the next job clears the slot as it takes it (nothing copied in either)

    reuse = True

    def shared(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` any slot holds (the job copies it into this one as it starts)."""
        return self.scheduler.held(tokens, lora_key(self.lora))

    def generate(self, tokens: list[int], sampling, *, cancelled: Optional[Callable[[], bool]] = None,
                 thinking=None, top_logprobs: Optional[int] = None, draft_max: Optional[int] = None) -> Iterator[Response]:
        """Stream the answer to `tokens` from this slot, decoded in the scheduler's batch; `cancelled` is
        asked between responses (once true, the job leaves the batch at the next step). The job is made
        and queued here, before the first response is asked for: a bad grammar or logit bias raises now.
        `top_logprobs`: each token's log-probability and that many alternatives' in the responses; `draft_max`:
        this request's cap on a lookup draft where the model drafts (0: none)."""
        from ...errors import UsageError

        if not tokens:
            raise UsageError("empty prompt: give some text as an argument or on stdin")
        scheduler = self.scheduler
        scheduler.engine.check_fits(len(tokens), self.n_ctx)
        if scheduler.engine.vision is not None and any(t < 0 for t in tokens):  # evaluated by the job's prefill
            scheduler.engine.vision.check(tokens)
        job = Job.create(scheduler.engine, tokens, sampling, max_tokens=sampling.max_tokens, n_ctx=self.n_ctx,
                         top_logprobs=top_logprobs, draft_max=draft_max, lora=self.lora)
        job.seq.thinking = thinking
        job.leased, job.reuse, self.reuse = self.slot, self.reuse, True
        job.sink = queue.SimpleQueue()
        if not scheduler.submit(job):
            job.sampler.close()
            scheduler._check_running()
            raise ServerStopping()
        return self._responses(job, cancelled)

    def _responses(self, job: Job, cancelled: Optional[Callable[[], bool]]) -> Iterator[Response]:
        scheduler = self.scheduler
        try:
            while True:
                if cancelled is not None and not job.cancelled and cancelled():
                    scheduler.cancel(job)
                try:
                    response = job.sink.get(timeout=0.05)
                except queue.Empty:
                    if scheduler.fatal or not scheduler.thread.is_alive():
                        raise ServerStopping(scheduler.fatal)
                    continue
                if response.done and response.finish_reason == "error":  # as in-process, where llama.cpp's error raises
                    raise EngineError(response.error or "llama.cpp failed during the answer")
                if response.done and response.finish_reason == "cancelled" and cancelled is not None and cancelled():
                    response.finish_reason = "interrupted"  # as an answer stopped in-process reads
                    if response.stats is not None:
                        response.stats.finish_reason = "interrupted"
                yield response
                if response.done:
                    return
        finally:
            if not job.seq.done:  # the consumer stopped early (a closed pipe): the job leaves the batch (its
                scheduler.cancel(job)  # slot is not free for another lease until it has)
