"""OpenAI's Responses API without a model: a Responses body in (with the conversation it continues), localrun's
request out; canned answer events in, the Responses events out; errors naming the fields as a Responses client
wrote them. The stored responses (serve.stored) on a real disk, in an isolated LOCALRUN_HOME."""

from __future__ import annotations

import asyncio
import threading

import pytest
from dialect_fakes import FakeFacts, canned, final, sse_data, written

from localrun.engine.types import TokenLogprob
from localrun.serve.asked import Image, ToolChoice
from localrun.serve.dialects import responses
from localrun.serve.errors import InvalidField, Refused
from localrun.serve.stored import Kept
from localrun.serve.stream import Event


def asked_of(data: dict, kept: Kept = None):
    kept = kept or Kept()
    return responses.asked_of(data, kept.get, kept.item, kept.size)


def _written_out() -> None:
    for thread in threading.enumerate():  # the stores written beside the answers
        if thread.name == "localrun-store-response":
            thread.join()


def test_a_responses_body_becomes_the_request():
    asked, conversation = asked_of({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 30, "temperature": 0.1, "stream": True,
        "reasoning": {"effort": "low"}, "include": ["message.output_text.logprobs"],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}, {"type": "web_search"}],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
                  {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Add."}]},
                  {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "call_1", "output": "2"}]})
    assert [(m.role, m.text) for m in asked.messages] == [("system", "Be brief."), ("user", "What is"), ("assistant", ""), ("tool", "2")]
    assert asked.messages[1].images == [Image("data:image/png;base64,AA", "input.0.content.1")]
    assert asked.messages[2].thinking == "Add." and asked.messages[2].calls[0].name == "add"
    assert [t.name for t in asked.tools] == ["add"]  # a web search does not run here
    assert (asked.max_tokens, asked.sampling, asked.effort, asked.top_logprobs) == (30, {"temperature": 0.1}, "low", 0)
    assert asked.json_schema == {"type": "object"} and asked.reply.stream
    # the conversation as it is kept (OpenAI's chat messages), its images without the field they came in
    assert conversation[1]["content"][0] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}


def test_responses_allowed_tools_become_the_requests():
    """The Responses API's flat allowed_tools (tools of other types left out, as they are from tools; none left: a 400)."""
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}}, {"type": "function", "name": "sub"}]
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "add"}, {"type": "web_search"}]}
    asked, _ = asked_of({"input": "hi", "tools": tools, "tool_choice": allowed})
    assert asked.choice == ToolChoice("required", allowed=("add",))
    with pytest.raises(Refused) as none:  # naming no function tool: nothing it names could be called
        asked_of({"input": "hi", "tools": tools, "tool_choice": {**allowed, "tools": [{"type": "web_search"}]}})
    assert none.value.field == "tool_choice"
    assert asked_of({"input": "hi", "tools": tools, "tool_choice": {"type": "function", "name": "sub"}})[0].choice == ToolChoice("function", name="sub")


@pytest.mark.parametrize("data, param, says", [
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "invalid 'max_output_tokens'"),  # localrun's max_tokens
    ({"input": "hi", "tool_choice": "required"}, "tool_choice", "needs function tools"),
    ({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}, "input.0", "'call_nope'"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt", "prompt templates"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id", "not found"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs its schema"),
    ({"input": [{"type": "computer_call"}]}, "input.0", "not supported"),
])
def test_errors_name_what_the_responses_client_wrote(data, param, says):
    with pytest.raises(Refused) as refused:
        asked_of(data)
    _, body = responses.error_answer(refused.value)
    assert body["error"]["param"] == param and says in body["error"]["message"], body


def test_a_field_in_localruns_names_is_named_as_the_responses_api_names_it():
    _, body = responses.error_answer(InvalidField("a list of messages", "messages.3.content"))
    assert body["error"] == {"message": "invalid 'input': a list of messages", "type": "invalid_request_error", "param": "input", "code": None}


def test_an_item_reference_is_the_stored_item_it_names(isolated_home):
    """The AI SDK's Responses model (store: true) sends an earlier answer back as {"type": "item_reference", "id"}: it
    reads as that item of a stored response, in memory or after a restart; an id no stored response has is a 400
    naming the item (moved here from tests/runtime/test_pure_pieces.py)."""
    rid = "resp_" + "7" * 24
    answer = {"type": "message", "id": "msg_answer", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Paris.", "annotations": [], "logprobs": []}]}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}", "status": "completed"}
    kept = Kept()
    kept.put(rid, [{"role": "user", "content": "Capital?"}], response={"id": rid, "output": [answer, call]},
             input_items=[{"type": "message", "id": "msg_q", "role": "user", "content": [{"type": "input_text", "text": "Capital?"}]}])
    _written_out()
    body = {"input": [{"type": "item_reference", "id": "msg_q"}, {"type": "item_reference", "id": "msg_answer"},
                      {"type": "item_reference", "id": "fc_1"}, {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
                      {"role": "user", "content": "And Italy's?"}]}
    for store in (kept, Kept()):  # in memory, and from the disk
        asked, _ = asked_of(body, store)
        assert [(m.role, m.text) for m in asked.messages] == [("user", "Capital?"), ("assistant", "Paris."), ("assistant", ""),
                                                              ("tool", "ok"), ("user", "And Italy's?")]
    with pytest.raises(Refused) as unknown:
        asked_of({"input": [{"type": "item_reference", "id": "msg_nope"}]}, kept)
    assert unknown.value.field == "input.0" and "'msg_nope'" in unknown.value.reason
    listed = responses.input_items(body, kept.item)  # the next turn lists (and keeps) the items referred to
    assert [i["type"] for i in listed] == ["message", "message", "function_call", "function_call_output", "message"]
    kept.put("resp_" + "6" * 24, [], response={"id": "resp_" + "6" * 24, "output": []}, input_items=listed)
    assert kept.item("msg_answer") == answer and asked_of(body, kept)[0].messages[1].text == "Paris."
    _written_out()
    assert kept.delete(rid) and kept.item("fc_1") == call  # the later response lists it too
    assert kept.delete("resp_" + "6" * 24) and kept.item("fc_1") is None and Kept().item("fc_1") is None


def test_a_previous_response_continues_its_conversation_its_images_named_by_it():
    kept = Kept()
    kept.put("resp_1", [{"role": "system", "content": "old"}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}, {"type": "text", "text": "This?"}]},
        {"role": "assistant", "content": "A cat.", "reasoning_content": "Fur."}], store=False)
    asked, conversation = asked_of({"previous_response_id": "resp_1", "input": "And now?", "instructions": "New."}, kept)
    assert [(m.role, m.text) for m in asked.messages] == [("system", "New."), ("user", "This?"), ("assistant", "A cat."), ("user", "And now?")]
    assert asked.messages[1].images == [Image("data:image/png;base64,AA", "previous_response_id")]
    assert asked.messages[2].thinking == "Fur." and conversation[0] == {"role": "system", "content": "New."}


def test_input_items_are_listed_a_page_at_a_time_as_openai_lists_them():
    given = responses.input_items({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"role": "assistant", "content": "It is sunny.", "id": "msg_mine"}]})
    assert [i["type"] for i in given] == ["message", "function_call", "function_call_output", "message"]
    assert all(i["id"] and i["status"] == "completed" for i in given) and given[3]["id"] == "msg_mine"
    page = responses.item_list(given, {"limit": "2"})
    assert [i["id"] for i in page["data"]] == ["msg_mine", given[2]["id"]] and page["has_more"]
    rest = responses.item_list(given, {"limit": "2", "after": page["last_id"]})
    assert [i["id"] for i in rest["data"]] == [given[1]["id"], given[0]["id"]] and not rest["has_more"]
    for query, param in (({"limit": "0"}, "limit"), ({"order": "up"}, "order"), ({"after": "msg_no"}, "after")):
        with pytest.raises(Refused) as bad:
            responses.item_list(given, query)
        assert bad.value.status == 400 and bad.value.field == param


def _events(*events: Event, logprobs_of=None) -> tuple[list[dict], list]:
    kept = []
    out = sse_data(written(responses.events(canned(*events), "resp_x", {}, "m", 1700000000, lambda *a: kept.append(a),
                                            logprobs_of=logprobs_of)))
    return out, kept


def test_an_empty_answer_streams_its_message_as_any_other():
    """An answer of no tokens streams the same item events as one with text, less the delta (moved here from
    tests/runtime/test_pure_pieces.py)."""
    empty, _ = _events(Event("done", final=final(generated=0)))
    said, kept = _events(Event("text", "Hi"), Event("done", final=final()))
    assert [e["type"] for e in empty] == [e["type"] for e in said if e["type"] != "response.output_text.delta"]
    assert [e["type"] for e in empty][2:7] == ["response.output_item.added", "response.content_part.added", "response.output_text.done",
                                               "response.content_part.done", "response.output_item.done"]
    assert empty[-1]["type"] == "response.completed" and empty[-1]["response"]["output"] == [empty[-2]["item"]]
    assert [e["sequence_number"] for e in empty] == list(range(len(empty)))
    assert {e["response"]["created_at"] for e in empty if "response" in e} == {1700000000}
    assert kept[0][0] == "Hi" and kept[0][2]["status"] == "completed"  # kept once answered


def test_thinking_text_and_calls_stream_as_items_and_a_cut_answer_ends_incomplete():
    facts = FakeFacts()
    out, _ = _events(Event("thinking", "Hm."), Event("text", "Sure.", logprobs=[TokenLogprob(5, -0.1)]),
                     Event("call", "{", index=0, name="add", id="call_1"), Event("call_args", "}", index=0),
                     Event("tool_calls", calls=[{"id": "call_1", "name": "add", "arguments": {}, "raw": "{}"}]),
                     Event("done", final=final("length")), logprobs_of=lambda entries: responses.logprobs_of(facts, entries))
    kinds = [e["type"] for e in out]
    assert kinds.count("response.output_item.added") == 3 and "response.reasoning_summary_text.delta" in kinds
    delta = next(e for e in out if e["type"] == "response.output_text.delta")
    assert delta["logprobs"] == [{"token": "t5", "logprob": -0.1, "bytes": list(b"t5"), "top_logprobs": []}]
    done = next(e for e in out if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == "{}" and out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_client_gone_mid_answer_is_kept_as_cancelled_and_a_failure_fails():
    kept = []

    async def leave_after_the_first_delta() -> None:
        writer = responses.events(canned(Event("text", "Hal"), Event("text", "lo")), "resp_x", {}, "m", 1, lambda *a: kept.append(a))
        for _ in range(5):  # created, in_progress, the message added, its text part added, its first delta
            await writer.__anext__()
        await writer.aclose()  # the client went away

    asyncio.run(leave_after_the_first_delta())
    assert kept and kept[0][0] == "Hal" and kept[0][2]["status"] == "cancelled"
    assert kept[0][1][0]["status"] == "incomplete" and kept[0][1][0]["content"][0]["text"] == "Hal"
    failed, kept = _events(Event("failed", "boom"))
    assert failed[-1]["type"] == "response.failed" and failed[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert kept == []
