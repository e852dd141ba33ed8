"""A server stopped right after an answer: the answer's thread still holds its seat and reads the slot's state
for the prefix cache. The scheduler serves those reads until the seats are given back (it used to refuse them
once stopping began, and the prefix entry of the last answer before a restart was lost now and then)."""

from __future__ import annotations

import pytest

from localrun.engine.sampling import merge_options
from localrun.runtime.loader import load
from localrun.runtime.scheduler import Scheduler, ServerStopping


def _deliver(responses) -> None:
    for job, response in responses:
        job.sink.put_nowait(response)


@pytest.fixture
def scheduler(smollm2):
    loaded = load(str(smollm2), ctx=512, parallel=1)
    scheduler = Scheduler(loaded.engine, parallel=1, slot_ctx=512, max_waiting=4, prefill_chunk=64, deliver=_deliver)
    scheduler.start()
    yield scheduler
    scheduler.stop()
    loaded.close()


def test_a_seat_still_held_reads_its_state_while_the_scheduler_stops(scheduler):
    prompt = scheduler.engine.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
    with scheduler.hold(prompt) as seat:
        answer = list(seat.generate(prompt, merge_options({"temperature": 0, "max_tokens": 4})))
        assert answer[-1].finish_reason == "length"
        scheduler.request_stop()  # Ctrl-C between the answer's last token and its prefix-cache read
        state = seat.state_bytes()
        assert len(state) > 0 and seat.tokens[:len(prompt)] == prompt and len(seat.tokens) > len(prompt)
        with pytest.raises(ServerStopping):  # nothing new is taken while stopping
            list(seat.generate(prompt, merge_options({"temperature": 0, "max_tokens": 4})))
    scheduler.thread.join(timeout=10)
    assert not scheduler.thread.is_alive()  # the seat given back, the thread ends without waiting out its grace
    with pytest.raises(ServerStopping):
        scheduler.call(lambda: None)
