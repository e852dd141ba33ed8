"""Anthropic's dialect without a model: a Messages body in, localrun's request out; canned answer events in,
Anthropic's message and events out; refusals in Anthropic's error shape (its types by status, its words for a
prompt over the context)."""

from __future__ import annotations

import pytest
from dialect_fakes import canned, final, sse_data, written

from localrun.errors import ContextOverflow
from localrun.runtime.serving.scheduler import QueueFull
from localrun.serve.asked import Call, Image, ToolChoice
from localrun.serve.dialects import anthropic
from localrun.serve.errors import Refused, TooLong
from localrun.serve.stream import Event

HI = [{"role": "user", "content": "hi"}]


def refusal(body: dict) -> Refused:
    with pytest.raises(Refused) as refused:
        anthropic.asked_of({"max_tokens": 5, **body})
    return refused.value


def test_a_messages_body_becomes_the_request():
    asked = anthropic.asked_of({
        "model": "m", "max_tokens": 40, "system": [{"type": "text", "text": "Be brief."}], "stream": True, "temperature": 0.5,
        "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 16}, "output_config": {"effort": "max"},
        "tools": [{"name": "add", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                                         {"type": "text", "text": "What is this?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look."}, {"type": "text", "text": "Let me add."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "2", "is_error": True},
                                         {"type": "text", "text": "And?"}]},
            {"role": "system", "content": "A reminder."}]})  # Claude Code's mid-conversation system message stays in place
    assert [(m.role, m.text) for m in asked.messages] == [("system", "Be brief."), ("user", "What is this?"),
                                                          ("assistant", "Let me add."), ("tool", "Error: 2"), ("user", "And?"),
                                                          ("system", "A reminder.")]
    assert asked.messages[1].images == [Image("data:image/png;base64,AAAA", "messages.0.content.0")]
    assert asked.messages[2].calls == [Call("add", '{"a": 1}', "toolu_1")] and asked.messages[2].thinking == "Look."
    assert asked.messages[3].call_id == "toolu_1"
    assert asked.choice == ToolChoice("required") and asked.parallel_calls is False and asked.tools[0].name == "add"
    assert asked.sampling == {"temperature": 0.5, "reasoning_budget": 16} and asked.stops == ["END"] and asked.max_tokens == 40
    assert (asked.think, asked.effort, asked.reply.stream) == (True, "high", True)


def test_anthropic_client_tools_are_offered_and_a_result_must_answer_a_use():
    """Anthropic's client tools (bash, text_editor: the client runs them, sending only type and name) reach the
    model in their published schema; computer use and server tools stay out; a tool_result answering no tool_use is
    a 400 as on Anthropic's API (moved here from tests/runtime/test_pure_pieces.py)."""
    tools = [{"type": "bash_20250124", "name": "bash"}, {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
             {"type": "web_search_20250305", "name": "web_search"}, {"type": "computer_20250124", "name": "computer"},
             {"name": "mine", "input_schema": {"type": "object"}}]
    asked = anthropic.asked_of({"max_tokens": 5, "messages": [{"role": "user", "content": "ls"}], "tools": tools})
    assert [t.name for t in asked.tools] == ["bash", "str_replace_based_edit_tool", "mine"]
    assert asked.tools[0].spec["parameters"]["properties"]["command"]["type"] == "string"
    assert "str_replace" in asked.tools[1].spec["parameters"]["properties"]["command"]["enum"]
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}
    assert anthropic.asked_of({"max_tokens": 5, "tools": tools, "messages": [{"role": "user", "content": "ls"}, use, answer]}).messages[-1].role == "tool"
    bad = refusal({"messages": [{"role": "user", "content": "ls"}, answer]})
    assert bad.field == "messages.1.content.0" and "'toolu_1' answers no tool_use" in bad.reason


def test_threads_structured_outputs_and_server_tool_blocks():
    """A message thread to continue is a 404 thread_not_found in error.details (the SDK then replays the whole
    conversation); output_config.format is the answer's JSON schema; a server tool's blocks in a history are passed
    over as thinking is (moved here from tests/runtime/test_pure_pieces.py)."""
    lost = refusal({"messages": HI, "thread": {"type": "continue", "previous_message_id": "msg_1"}})
    status, body = anthropic.error_answer(lost)
    assert status == 404 and body["error"]["details"] == {"error_code": "thread_not_found"} and body["error"]["type"] == "not_found_error"
    assert anthropic.asked_of({"max_tokens": 5, "messages": HI, "thread": {"type": "create"}}).messages[0].text == "hi"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for body in ({"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}},
                 {"output_format": {"type": "json_schema", "schema": schema}}):
        assert anthropic.asked_of({"max_tokens": 5, "messages": HI, **body}).json_schema == schema
    assert refusal({"messages": HI, "output_config": {"format": {"type": "yaml"}}}).field == "output_config.format"
    searched = {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}, {"type": "text", "text": "Found it."}]}
    assert anthropic.asked_of({"max_tokens": 5, "messages": [*HI, searched, *HI]}).messages[1].text == "Found it."
    _, plain = anthropic.error_answer(Refused("x", "model", status=404, code="model_not_found"))
    assert plain["error"].get("details") is None


@pytest.mark.parametrize("body, field", [
    ({"messages": []}, "messages"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": HI, "tool_choice": {"type": "any"}}, "tool_choice"),  # no tools: nothing to call
    ({"messages": HI, "temperature": "hot"}, "temperature"),
    ({"messages": HI, "draft_max": "all"}, "draft_max"),
    ({"messages": HI, "thinking": {"type": "enabled", "budget_tokens": -1}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "messages.0.content.0"),
])
def test_bad_bodies_are_refused_naming_the_field(body, field):
    assert refusal(body).field == field


def test_errors_in_anthropics_shape():
    status, body = anthropic.error_answer(TooLong(ContextOverflow("x", n_prompt=2000, n_ctx=1024), "messages"))
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: 2000 tokens > 1024 maximum (This model's maximum")
    assert anthropic.error_answer(QueueFull(3))[1]["error"]["type"] == "rate_limit_error"
    assert anthropic.error_answer(Refused("busy", status=503))[1]["error"]["type"] == "overloaded_error"


def _progress(cached: int):
    return type("Progress", (), {"total": 10, "cached": cached, "processed": 10})()


def test_a_stream_in_anthropics_events():
    """message_start waits for the prompt's progress (its cached part), a block per thinking, text and tool_use, the
    thinking block's signature as it closes, message_delta with the stop reason and the totals."""
    events = canned(Event("progress", progress=_progress(6)), Event("thinking", "Hm."), Event("text", "Sure."),
                    Event("ping"), Event("call", '{"a":', index=0, name="add", id="call_abc"), Event("call_args", " 1}", index=0),
                    Event("tool_calls", calls=[{"id": "call_abc", "name": "add", "arguments": {"a": 1}, "raw": '{"a": 1}'}]),
                    Event("done", final=final("stop", prompt=10, generated=5, cached=6)))
    out = sse_data(written(anthropic.events(events, "m", 10, [])))
    kinds = [e["type"] for e in out]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta", "ping", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert out[0]["message"]["usage"] == {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 6,
                                          "output_tokens": 0}
    assert out[4]["delta"] == {"type": "signature_delta", "signature": ""} and out[7]["delta"] == {"type": "text_delta", "text": "Sure."}
    assert out[10]["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "add", "input": {}}
    assert [out[11]["delta"]["partial_json"], out[12]["delta"]["partial_json"]] == ['{"a":', " 1}"]
    assert out[14]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[14]["usage"] == {"input_tokens": 4, "cache_read_input_tokens": 6, "cache_creation_input_tokens": 0, "output_tokens": 5}


def test_pings_before_the_prompts_progress_do_not_start_the_message():
    """A prompt waiting for a slot, or a first chunk slower than the ping interval: the pings go out alone, and
    message_start still carries the cached part its progress brings."""
    events = canned(Event("ping"), Event("ping"), Event("progress", progress=_progress(7)), Event("text", "a"),
                    Event("done", final=final("stop", prompt=10, generated=1, cached=7)))
    out = sse_data(written(anthropic.events(events, "m", 10, [])))
    assert [e["type"] for e in out[:4]] == ["ping", "ping", "message_start", "ping"]
    assert out[2]["message"]["usage"]["cache_read_input_tokens"] == 7 and out[2]["message"]["usage"]["input_tokens"] == 3


def test_a_stream_without_progress_starts_at_once_and_a_failure_ends_it():
    out = sse_data(written(anthropic.events(canned(Event("text", "a"), Event("failed", "gone")), "m", 3, [])))
    assert out[0]["message"]["usage"]["cache_read_input_tokens"] == 0
    assert out[-1] == {"type": "error", "error": {"type": "api_error", "message": "gone"}}


def test_a_whole_message_and_its_stop_reasons():
    stopped = final("stop", stop_sequence="END")
    whole = anthropic.message("m", "Hi", "Hm.", [], stopped, ["END"])
    assert [b["type"] for b in whole["content"]] == ["thinking", "text"] and whole["stop_reason"] == "stop_sequence"
    assert whole["stop_sequence"] == "END"
    assert anthropic.stop_reason(final("length", context_full=True), [], []) == ("model_context_window_exceeded", None)
    assert anthropic.stop_reason(final("length"), [], []) == ("max_tokens", None)
    assert anthropic.stop_reason(final("eos"), [{"id": "x"}], []) == ("tool_use", None)
    assert anthropic.tool_use_id("call_1") == "toolu_1" and anthropic.tool_use_id("a1b2c3d4e") == "a1b2c3d4e"
