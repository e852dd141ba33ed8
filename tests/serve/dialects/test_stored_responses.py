"""The Responses API's stored responses (serve.stored.Kept), on a real disk in an isolated LOCALRUN_HOME: kept to
continue from, read back after a restart, in progress while answered, deleted (moved here from
tests/runtime/test_pure_pieces.py when serve.responses became serve.dialects.responses and serve.stored)."""

from __future__ import annotations

import json
import threading

from localrun.serve.dialects.responses import input_items
from localrun.serve.stored import Kept


def test_a_stored_response_keeps_its_object_and_one_stored_before_that_still_continues(isolated_home):
    from localrun.store.responses import folder, load_response, save_response

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rid, old = "resp_" + "a" * 24, "resp_" + "b" * 24
    save_response(rid, conversation, {"id": rid, "object": "response"})
    assert load_response(rid) == (conversation, {"id": rid, "object": "response"}, None)
    (folder() / f"{old}.json").write_text(json.dumps(conversation))  # a file written before the object was kept
    assert load_response(old) == (conversation, None, None)
    kept = Kept(size=1)  # nothing of these in memory: both read from the disk
    assert kept.get(old) == conversation and kept.envelope(rid)["id"] == rid
    assert kept.delete(rid) and not kept.delete(rid) and load_response(rid) is None
    kept.put("resp_" + "c" * 24, conversation, store=False, response={"id": "x"})  # kept to continue, not to be read
    assert kept.get("resp_" + "c" * 24) == conversation and kept.envelope("resp_" + "c" * 24) is None
    assert not kept.delete("resp_" + "c" * 24) and kept.get("resp_" + "c" * 24) == conversation


def test_a_stored_response_reads_as_in_progress_until_answered_and_one_deleted_meanwhile_is_not_kept(isolated_home):
    """GET /v1/responses/{id} of a response still being answered reads its in-progress object (it was a 404);
    one deleted while being answered is neither kept nor written when its answer comes; one that failed
    (`end` without `put`) is gone."""
    from localrun.store.responses import folder, load_response

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    kept = Kept()
    one, two, three = ("resp_" + c * 24 for c in "def")
    kept.begin(one, {"id": one, "status": "in_progress"})
    assert kept.envelope(one)["status"] == "in_progress" and kept.get(one) is None  # nothing to continue from yet
    kept.put(one, conversation, response={"id": one, "status": "completed"})
    assert kept.envelope(one)["status"] == "completed" and kept.get(one) == conversation
    kept.begin(two, {"id": two, "status": "in_progress"})
    assert kept.delete(two) and kept.envelope(two) is None
    kept.put(two, conversation, response={"id": two, "status": "completed"})
    assert kept.envelope(two) is None and kept.get(two) is None
    kept.begin(three, {"id": three, "status": "in_progress"})
    kept.end(three)
    assert kept.envelope(three) is None and not kept.delete(three)
    for thread in threading.enumerate():  # the stores written beside the answers
        if thread.name == "localrun-store-response":
            thread.join()
    assert load_response(one)[1]["status"] == "completed" and load_response(two) is None
    assert sorted(p.name for p in folder().iterdir()) == [f"{one}.json"]
    small = Kept(size=1)  # an in-progress entry whose end never comes (a stream never started) does not stay forever
    small.begin(two, {"id": two}), small.begin(three, {"id": three})
    assert small.envelope(two) is None and small.envelope(three) == {"id": three}


def test_a_stored_responses_input_items_are_kept_in_memory_and_on_disk(isolated_home):
    given = input_items({"input": [{"role": "user", "content": "Weather in Paris?"},
                                   {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}]})
    rid = "resp_" + "9" * 24
    kept = Kept()
    kept.begin(rid, {"id": rid, "status": "in_progress"}, given)
    assert kept.input_items(rid) == given  # while it is being answered too
    kept.put(rid, [{"role": "user", "content": "x"}], response={"id": rid}, input_items=given)
    kept.put("resp_" + "8" * 24, [], store=False, response={"id": "x"}, input_items=given)
    assert kept.input_items("resp_" + "8" * 24) is None  # not stored: nothing to list
    for thread in threading.enumerate():
        if thread.name == "localrun-store-response":
            thread.join()
    assert Kept().input_items(rid) == given  # from the disk
