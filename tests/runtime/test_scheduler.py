"""The server's scheduler, in-process on a real model: what a seat may still do while the server stops, and
prompts with images prefilled in the shared batch beside the other slots."""

from __future__ import annotations

import pytest

from localrun.engine.sampling import merge_options
from localrun.engine.vision import MARKER, Image
from localrun.runtime.loader import load
from localrun.runtime.options import LoadSpec
from localrun.runtime.serving.scheduler import Scheduler, ServerStopping
from projector import red_square

GREEDY = {"temperature": 0, "max_tokens": 4}


def _deliver(responses) -> None:
    for job, response in responses:
        job.sink.put_nowait(response)


def start(smollm2, *, parallel=1, chunk=64, on_step=None, mmproj=None):
    loaded = load(str(smollm2), LoadSpec(ctx=512 * parallel, parallel=parallel))
    if mmproj is not None:
        loaded.engine.load_projector(mmproj)
    scheduler = Scheduler(loaded.engine, parallel=parallel, slot_ctx=512, max_waiting=4, prefill_chunk=chunk,
                          deliver=_deliver, on_step=on_step)
    scheduler.start()
    return loaded, scheduler


def test_a_seat_still_held_reads_its_state_while_the_scheduler_stops(smollm2):
    """A server stopped right after an answer: the answer's thread still holds its seat and reads the slot's
    state for the prefix cache. The scheduler serves those reads until the seats are given back (it used to
    refuse them once stopping began, and the last answer's prefix entry was lost now and then)."""
    loaded, scheduler = start(smollm2)
    try:
        prompt = scheduler.engine.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
        with scheduler.hold(prompt) as seat:
            answer = list(seat.generate(prompt, merge_options(GREEDY)))
            assert answer[-1].finish_reason == "length"
            scheduler.request_stop()  # Ctrl-C between the answer's last token and its prefix-cache read
            state = seat.state_bytes()
            assert len(state) > 0 and seat.tokens[:len(prompt)] == prompt and len(seat.tokens) > len(prompt)
            with pytest.raises(ServerStopping):  # nothing new is taken while stopping
                list(seat.generate(prompt, merge_options(GREEDY)))
        scheduler.thread.join(timeout=10)
        assert not scheduler.thread.is_alive()  # the seat given back, the thread ends without waiting out its grace
        with pytest.raises(ServerStopping):
            scheduler.call(lambda: None)
    finally:
        scheduler.stop()
        loaded.close()


def test_an_image_prompt_is_prefilled_in_the_shared_batch(smollm2, image_files):
    """A prompt with an image takes its text in the step's batch, chunk by chunk beside a slot that decodes,
    and its image alone between two steps (it used to go in whole, text and image, while every other slot
    waited); its greedy answer is the one it gets alone."""
    seen, watched = [], []  # per step: tokens in the batch, slots decoding, what the watched slot holds

    def on_step(n: int, decoding: int) -> None:
        if watched:
            seen.append((n, decoding, list(scheduler.engine.kv.tokens[watched[0]])))

    loaded, scheduler = start(smollm2, parallel=2, chunk=8, mmproj=image_files / "mmproj-test.gguf", on_step=on_step)
    try:
        engine = scheduler.engine
        head = "<|im_start|>system\n" + "You answer questions about pictures in a few words. " * 4 + "<|im_end|>\n"
        text = head + f"<|im_start|>user\n{MARKER}What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
        prompt = engine.vision.tokenize(text, [Image(red_square(), "red.png")])
        first_image = next(i for i, t in enumerate(prompt) if t < 0)
        assert first_image > 3 * 8  # text enough before the image for several chunks

        with scheduler.hold() as seat:  # alone, from an empty slot
            seat.reset()
            alone = [t for r in seat.generate(prompt, merge_options(GREEDY)) for t in r.tokens]
        with scheduler.hold() as other:
            other.reset()  # one slot decodes a long answer while the other takes the image prompt
            talk = other.generate(engine.tokenize("Count from one to a hundred in words:"), merge_options({"temperature": 0, "max_tokens": 200}))
            next(talk)
            with scheduler.hold() as seat:
                seat.reset()
                watched.append(seat.slot.seq_id)
                beside = list(seat.generate(prompt, merge_options(GREEDY)))
            talk.close()
        assert [t for r in beside for t in r.tokens] == alone
        assert beside[-1].stats.prompt_tokens == len(prompt)
        # Steps where the other slot decoded while this one held part of the text before the image, and none of it yet
        partial = [held for n, decoding, held in seen if decoding == 1 and 0 < len(held) < first_image]
        assert len(partial) >= 2, seen
        assert all(held == prompt[:len(held)] for held in partial)
    finally:
        scheduler.stop()
        loaded.close()


def test_a_request_takes_a_free_slot_beside_the_busy_ones(gemma):
    """Where each slot is a KV stream of its own (a sliding-window model's, gemma-3's) llama.cpp batches only
    consecutive sequence ids in one pass over the weights, so a request takes the free slot beside the busy
    ones, not the least recently used one (concurrent requests scattered over slots 0, 2, 5, 7 decoded at half
    speed), and not even the one holding its prefix: that prefix is copied into the slot beside, and not
    evaluated again."""
    loaded, scheduler = start(gemma, parallel=4)
    try:
        assert scheduler.engine.kv.n_stream == 4 and not scheduler.engine.options.shared_kv
        slots = scheduler.slots
        slots[0].leased = slots[2].leased = True  # two requests running in slots 0 and 2
        slots[1].last_used, slots[3].last_used = 10.0, 1.0  # slot 3 is the least recently used
        with scheduler.hold() as seat:
            assert seat.slot.seq_id == 1  # between the two busy slots: one run of 0-2
        slots[0].leased = slots[2].leased = False

        slots[1].leased = True  # busy: 1; free: 0 and 2 beside it, 3 not
        slots[0].last_used, slots[2].last_used, slots[3].last_used = 10.0, 20.0, 1.0
        with scheduler.hold() as seat:
            assert seat.slot.seq_id == 0  # beside the busy slot, the less recently used of the two
            prompt = scheduler.engine.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
            first = list(seat.generate(prompt, merge_options(GREEDY)))
        slots[1].leased = False
        slots[2].leased = True  # now slots 1 and 3 are beside a busy slot (3 the less recently used), 0 holds the prompt
        with scheduler.hold(prompt) as seat:
            assert seat.slot.seq_id == 3  # the neighbour outweighs a prefix held elsewhere...
            again = list(seat.generate(prompt, merge_options(GREEDY)))
        assert again[-1].stats.cached_tokens == len(prompt) - 1  # ...which is copied from slot 0, not evaluated
        assert [t for r in again for t in r.tokens] == [t for r in first for t in r.tokens]
        slots[2].leased = False  # (left leased, the stop waited SETTLE_S for that made-up request to give it back)
    finally:
        scheduler.stop()
        loaded.close()


def test_a_burst_sharing_a_long_prefix_evaluates_it_once(smollm2):
    """Requests that arrive together with one long system prompt (an agent's fan-out, a sampler's batch): the
    first evaluates it, the others wait for it to be in the KV and copy it from that slot instead of evaluating
    the same tokens beside it; each still gets the answer it gets alone."""
    import queue

    from localrun.runtime.serving.scheduler import PREFIX_WAIT, Job

    loaded, scheduler = start(smollm2, parallel=3, chunk=64)
    try:
        engine = scheduler.engine
        system = engine.tokenize("You are a careful assistant. Answer briefly and check every fact twice. " * 12)
        prompts = [system + engine.tokenize(f" Question {i}: name a colour.", add_special=False) for i in range(3)]
        shared = min(len(p) for p in prompts) - 8
        assert shared > PREFIX_WAIT + 64  # longer than a chunk: the others wait over several steps

        def jobs(reuse: bool) -> list:
            made = []
            for prompt in prompts:
                job = Job.create(engine, prompt, merge_options(GREEDY), max_tokens=4, n_ctx=512)
                job.sink, job.reuse = queue.Queue(), reuse
                made.append(job)
            return made

        def answers(batch: list, one_at_a_time: bool) -> list:
            out = []
            for job in batch:
                assert scheduler.submit(job)
                if one_at_a_time:
                    out.append(_collect(job))
            return out or [_collect(job) for job in batch]

        burst = jobs(True)
        together = answers(burst, one_at_a_time=False)
        cached = sorted(job.seq.stats.cached_tokens for job in burst)
        assert cached[0] == 0 and all(c >= common_prefix_len(prompts) for c in cached[1:]), cached
        alone = answers(jobs(False), one_at_a_time=True)  # no reuse: each evaluates its whole prompt
        assert together == alone
    finally:
        scheduler.stop()
        loaded.close()


def common_prefix_len(prompts: list) -> int:
    from localrun.engine.kv import common_prefix

    return min(common_prefix(prompts[0], p) for p in prompts[1:])


def _collect(job) -> list:
    tokens = []
    while True:
        response = job.sink.get(timeout=60)
        tokens += response.tokens
        if response.done:
            return tokens
