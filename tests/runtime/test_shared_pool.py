"""The background server's run and chat slots share one KV pool of the model's context (llama.cpp's unified KV,
as llama-server's slots do by default): one request may fill all of it, and when the requests running together
need more than it holds, what idle slots keep for prefix reuse goes first, then a prompt waits for the answers
beside it to end. A request alone answers as in-process. Real llama.cpp on SmolLM2, the scheduler in-process."""

from __future__ import annotations

import queue
import threading

from localrun.engine.gguf_info import kv_cache_bytes
from localrun.engine.sampling import merge_options
from localrun.runtime.loader import load
from localrun.runtime.options import LoadSpec
from localrun.runtime.serving.scheduler import Job, Scheduler

GREEDY = {"temperature": 0, "max_tokens": 8}


def _deliver(responses) -> None:
    for job, response in responses:
        job.sink.put_nowait(response)


def start(smollm2, ctx: int, parallel: int):
    loaded = load(str(smollm2), LoadSpec(ctx=ctx, parallel=parallel, kind="run", threads=1))
    scheduler = Scheduler(loaded.engine, parallel=parallel, slot_ctx=loaded.engine.n_ctx, max_waiting=4, prefill_chunk=64,
                          deliver=_deliver)
    scheduler.start()
    return loaded, scheduler


def submit(scheduler, prompt: list[int], reuse: bool = True) -> Job:
    job = Job.create(scheduler.engine, prompt, merge_options(GREEDY), max_tokens=GREEDY["max_tokens"], n_ctx=scheduler.n_ctx)
    job.sink, job.reuse = queue.Queue(), reuse
    assert scheduler.submit(job)
    return job


def collect(job) -> tuple[list[int], str]:
    tokens = []
    while True:
        response = job.sink.get(timeout=120)
        tokens += response.tokens
        if response.done:
            return tokens, response.finish_reason


def test_one_pool_of_the_context_for_all_slots(smollm2):
    """Four slots of a 1024-token context hold one KV cache of 1024 tokens (they held four), and one request
    may fill more than a quarter of it."""
    loaded, scheduler = start(smollm2, 1024, 4)
    try:
        engine = scheduler.engine
        assert engine.options.shared_kv and engine.kv.n_stream == 1 and engine.n_ctx == scheduler.n_ctx == 1024
        assert engine.options.n_ctx == 1024  # llama.cpp's context: the pool itself, not 4 x 1024
        prompt = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 60)
        assert 1024 // 4 < len(prompt) < 1024 - 16
        tokens, reason = collect(submit(scheduler, prompt))
        assert reason == "length" and len(tokens) == GREEDY["max_tokens"]
    finally:
        scheduler.stop()
        loaded.close()
    assert kv_cache_bytes(engine.info, 1024) < kv_cache_bytes(engine.info, 4 * 1024)


def answer(scheduler, prompt: list[int], reuse: bool = True) -> tuple[list[int], str]:
    """A request as run and chat make it: a slot held for it, the answer generated there."""
    with scheduler.hold(prompt) as seat:
        if not reuse:
            seat.reset()
        responses = list(seat.generate(prompt, merge_options(GREEDY)))
    return [t for r in responses for t in r.tokens], responses[-1].finish_reason


def test_a_prompt_waits_for_room_and_gets_the_answer_it_gets_alone(smollm2):
    """Two prompts of 300 tokens at once in a pool of 512: the second is evaluated once the first answer ends and
    gives back its cells (both failed: 'llama.cpp decode failed (code 1)'). A request alone answers as from an
    empty pool, in-process: what idle slots kept made way for it."""
    loaded, scheduler = start(smollm2, 512, 2)
    try:
        engine = scheduler.engine
        prompts = [engine.tokenize(f"Story {i}: " + "the quick brown fox jumps over the lazy dog, " * 30) for i in range(3)]
        assert all(280 < len(p) < 512 - GREEDY["max_tokens"] for p in prompts)
        alone = [answer(scheduler, prompt, reuse=False) for prompt in prompts]
        got: list = [None, None]
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, answer(scheduler, prompts[i]))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert [g[1] for g in got] == ["length", "length"] and [len(g[0]) for g in got] == [GREEDY["max_tokens"]] * 2
        assert answer(scheduler, prompts[2]) == alone[2]  # alone again: as from an empty pool
        assert sum(len(engine.kv.tokens[s.seq_id]) > 0 for s in scheduler.slots) == 1
    finally:
        scheduler.stop()
        loaded.close()
