"""A chat's conversation on the server (runtime.serving.resident.converse), driven as the server drives it, on a real
model and scheduler: what a client's first and second Ctrl-C leave in the conversation and its session."""

from __future__ import annotations

import threading
from collections import OrderedDict
from types import SimpleNamespace

from localrun.runtime.loader import load
from localrun.runtime.options import LoadSpec
from localrun.runtime.serving.resident import converse
from localrun.runtime.serving.scheduler import Scheduler
from localrun.runtime.sessions import Sessions


def _deliver(responses) -> None:
    for job, response in responses:
        job.sink.put_nowait(response)


def send(resident, text: str, messages: list[dict], *, session: str, stop_after: int, hard: bool) -> list[dict]:
    """Ask `text` of conversation "c" (whose client holds `messages`) and stop the answer after `stop_after`
    pieces: `hard`, as a second Ctrl-C does (the connection closes), else as the first does (POST /api/cancel)."""
    items: list[dict] = []
    asked, closed = threading.Event(), threading.Event()

    def put(item: dict) -> None:
        items.append(item)
        if sum("text" in i for i in items) >= stop_after:
            (closed if hard else asked).set()

    converse(resident, {"op": "send", "conversation": "c", "messages": messages, "text": text, "session": session,
                        "sampling": {"temperature": 0, "max_tokens": 64, "min_tokens": 64}},
             fresh=False, put=put, cancelled=lambda: asked.is_set() or closed.is_set(), gone=closed.is_set)
    return items


def test_an_answer_its_client_hung_up_on_is_dropped_with_its_question_as_the_repl_says(smollm2):
    """Through the server, a chat's second Ctrl-C closes its connection and the REPL says "the message was
    dropped"; the server kept the question and the partial answer all the same, and saved them in the session,
    until the chat's next message replaced them. Now the server drops that exchange too; a first Ctrl-C's
    partial answer still stays, and is saved, as in-process."""
    loaded = load(str(smollm2), LoadSpec(ctx=1024, parallel=1))
    scheduler = Scheduler(loaded.engine, parallel=1, slot_ctx=1024, max_waiting=4, prefill_chunk=64, deliver=_deliver)
    scheduler.start()
    resident = SimpleNamespace(loaded=loaded, scheduler=scheduler, conversations=OrderedDict())
    try:
        items = send(resident, "Tell me a long story about a fox.", [], session="s", stop_after=3, hard=False)
        done = items[-1]
        assert done["done"]["finish_reason"] == "interrupted"
        kept = [m["content"] for m in done["messages"]]
        assert kept[0] == "Tell me a long story about a fox." and kept[1]  # the partial answer stays
        with Sessions.open() as sessions:
            assert [m["content"] for m in sessions.messages("s", loaded.engine, 1024)] == kept

        items = send(resident, "And one about an owl.", done["messages"], session="s", stop_after=3, hard=True)
        done = items[-1]
        assert done["done"]["finish_reason"] == "interrupted" and sum("text" in i for i in items) >= 3
        assert [m["content"] for m in done["messages"]] == kept  # the owl is gone, question and answer
        assert [m["content"] for m in resident.conversations["c"].messages] == kept
        with Sessions.open() as sessions:
            assert [m["content"] for m in sessions.messages("s", loaded.engine, 1024)] == kept  # nor saved
    finally:
        scheduler.stop()
        loaded.close()
