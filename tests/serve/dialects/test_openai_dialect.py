"""OpenAI's dialect without a model: a /v1 body in, localrun's request out (serve.asked.Asked); canned answer events
in, OpenAI's JSON and server-sent events out; refusals in OpenAI's error shape naming the field as written."""

from __future__ import annotations

import json

import pytest
from dialect_fakes import FakeFacts, canned, final, sse_data, written

from localrun.engine.types import TokenLogprob
from localrun.errors import ContextOverflow
from localrun.runtime.options import DRAFT_MAX
from localrun.runtime.serving.scheduler import QueueFull
from localrun.serve.asked import Call, Image, ToolChoice
from localrun.serve.dialects import openai
from localrun.serve.errors import Refused, TooLong
from localrun.serve.stream import Event

HI = [{"role": "user", "content": "Hi"}]
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}, "strict": True}}
PNG = "data:image/png;base64,iVBORw0KGgo="


def chat(**body):
    return openai.chat_asked(openai.parse_body(json.dumps({"messages": HI, **body}).encode(), openai.ChatBody))


def completion(**body):
    return openai.completion_asked(openai.parse_body(json.dumps(body).encode(), openai.CompletionBody))


def refusal(**body) -> tuple[int, dict]:
    with pytest.raises(Exception) as refused:
        chat(**body)
    status, shaped = openai.error_answer(refused.value)
    return status, shaped["error"]


def test_a_chat_body_becomes_the_request():
    asked = chat(model="m", messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "image_url", "image_url": {"url": PNG}},
                                     {"type": "text", "text": " this?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "Look first.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "2"}],
        tools=[ADD], tool_choice="required", parallel_tool_calls=False, temperature=0.2, seed=7, stop="END",
        logit_bias={"5": -100}, max_completion_tokens=30, max_tokens=99, stream=True, stream_options={"include_usage": True},
        chat_template_kwargs={"enable_thinking": False, "x": 1}, reasoning_effort="low", reasoning_format="none")
    assert [(m.role, m.text) for m in asked.messages] == [("system", "Be brief."), ("user", "What is this?"),
                                                          ("assistant", ""), ("tool", "2")]
    assert asked.messages[1].images == [Image(PNG, "messages.1.content.1")]  # named by its place, for its errors
    assert asked.messages[2].calls == [Call("add", "{\"a\": 1}", "call_1")] and asked.messages[2].thinking == "Look first."
    assert (asked.messages[3].call_id, asked.messages[3].name) == ("call_1", "add")
    assert [t.for_template() for t in asked.tools] == [ADD]  # strict and the rest reach the template as given
    assert asked.choice == ToolChoice("required") and asked.parallel_calls is False
    assert asked.sampling == {"temperature": 0.2, "seed": 7} and asked.stops == ["END"] and asked.logit_bias == {5: -100.0}
    assert asked.max_tokens == 30  # max_completion_tokens before max_tokens, as OpenAI's
    assert (asked.think, asked.effort, asked.template_kwargs, asked.reasoning) == (False, "low", {"x": 1}, "none")
    assert asked.reply.stream and asked.reply.usage and asked.reply.n == 1


def test_llama_servers_and_ollamas_own_fields_are_taken_as_the_clients_send_them():
    asked = chat(num_ctx=2048, n_predict=12, **{"speculative.n_max": 99}, reasoning_budget_tokens=8, options={"num_batch": 64},
                 response_format={"type": "json_object", "schema": {"type": "object"}}, ignore_eos=True, return_progress=True)
    assert asked.load == {"ctx": 2048, "batch": 64} and asked.max_tokens == 12
    assert asked.draft_max == DRAFT_MAX and asked.sampling == {"reasoning_budget": 8}  # a slot's most, llama-server's any count
    assert asked.json_schema == {"type": "object"} and asked.ignore_eos and asked.reply.progress
    assert chat(response_format={"type": "json_object"}).json_object
    assert chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}).json_schema == {"type": "array"}


@pytest.mark.parametrize("choice, expected", [
    (None, ToolChoice()), ("none", ToolChoice("none")),
    ({"type": "function", "function": {"name": "add"}}, ToolChoice("function", name="add")),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]}},
     ToolChoice("required", allowed=("add",))),
])
def test_tool_choice(choice, expected):
    assert chat(tools=[ADD], tool_choice=choice).choice == expected


def test_completions_take_one_prompt_a_suffix_and_logprobs_as_a_count():
    asked = completion(prompt=["def f():"], suffix="    return 1", logprobs=3)
    assert (asked.prompt, asked.suffix, asked.top_logprobs, asked.messages) == ("def f():", "    return 1", 3, None)
    assert completion(prompt=[[1, 2, 3]]).prompt == [1, 2, 3]
    with pytest.raises(Refused) as several:
        completion(prompt=["a", "b"])
    assert several.value.field == "prompt" and "a list of 2 prompts" in several.value.reason


@pytest.mark.parametrize("body, param, says", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}]}, "messages.0.content.0.foo", "unknown or unsupported field"),
    ({"Stream": True}, "Stream", "unknown or unsupported field 'Stream'"),
    ({"max_tokens": "10"}, "max_tokens", "invalid 'max_tokens'"),
    ({"messages": [{"role": "user"}]}, "messages.0", "needs its content"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "invalid"),
    ({"audio": {}}, "audio", "'audio' is not supported by localrun serve"),
    ({"n": 2, "stream": True}, "n with stream", "not supported"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs must be 0 to 20"),
    ({"response_format": {"type": "xml"}}, "response_format", "unsupported response_format type 'xml'"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs", "enable_thinking must be true or false"),
    ({"options": {"num_ctxx": 1}}, "options.num_ctxx", "unknown load option 'num_ctxx'"),
    ({"speculative.n_max": -1}, "speculative.n_max", "a whole number"),
])
def test_bad_bodies_are_refused_naming_the_field_as_written(body, param, says):
    status, error = refusal(**body)
    assert status == 400 and error["param"] == param and says in error["message"] and error["type"] == "invalid_request_error"


def test_refusals_of_the_request_path_in_openais_words():
    too_long = TooLong(ContextOverflow("too long", n_prompt=2000, n_ctx=1024), "messages")
    status, body = openai.error_answer(too_long)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"
    assert body["error"]["message"].startswith("This model's maximum context length is 1024 tokens (a slot's context), but the"
                                               " prompt is 2000 tokens: shorten it, or restart the server with a larger --ctx")
    status, body = openai.error_answer(QueueFull(64))
    assert (status, body["error"]["type"], body["error"]["code"]) == (429, "rate_limit_error", "queue_full")


def test_a_stream_in_openais_chunks():
    events = canned(Event("progress", progress=type("P", (), {"total": 9, "cached": 4, "processed": 9})()),
                    Event("thinking", "Hm."), Event("text", "Hel", logprobs=[TokenLogprob(7, -0.5, [(7, -0.5), (8, -1.0)])]),
                    Event("ping"), Event("call", "{\"a\":", index=0, name="add", id="call_9"), Event("call_args", " 1}", index=0),
                    Event("tool_calls", calls=[{"id": "call_9", "name": "add", "arguments": {"a": 1}, "raw": "{\"a\": 1}"}]),
                    Event("done", final=final("stop", prompt=9, generated=4, cached=4)))
    out = sse_data(written(openai.sse(events, "chatcmpl-1", True, True, "m", FakeFacts(), 1, progress=True)))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert out[1]["prompt_progress"]["cache"] == 4 and out[2]["choices"][0]["delta"] == {"reasoning_content": "Hm."}
    assert out[3]["choices"][0]["delta"] == {"content": "Hel"} and out[3]["usage"] is None
    assert out[3]["choices"][0]["logprobs"]["content"][0] == {"token": "t7", "logprob": -0.5, "bytes": list(b"t7"),
                                                              "top_logprobs": [{"token": "t7", "logprob": -0.5, "bytes": list(b"t7")},
                                                                               {"token": "t8", "logprob": -1.0, "bytes": list(b"t8")}]}
    assert out[4] == ": keep-alive"
    assert out[5]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "id": "call_9", "type": "function",
                                                            "function": {"name": "add", "arguments": "{\"a\":"}}]
    assert out[6]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": " 1}"}}]
    assert out[7]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[8]["choices"] == [] and out[8]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4} and out[9] == "[DONE]"


def test_a_failed_stream_ends_with_an_error_event_and_a_completion_streams_text():
    out = sse_data(written(openai.sse(canned(Event("text", "a"), Event("failed", "the server is shutting down: retry later")),
                                      "cmpl-1", False, False, "m")))
    assert out[0]["choices"][0]["text"] == "a" and "usage" not in out[0]
    assert out[1] == {"error": {"message": "the server is shutting down: retry later", "type": "server_error", "param": None, "code": None}}


def test_a_whole_answer_with_calls_and_n_choices_merged():
    reply = openai.completion("chatcmpl-1", True, "m", "ignored", final("stop"), None,
                              read=lambda text: ("", [{"id": "call_1", "name": "add", "arguments": {"a": 1}, "raw": "{\"a\":1}"}]))
    message = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]
    two = openai.merged([openai.completion("", False, "m", t, final("length", prompt=5, generated=2)) for t in ("a", "b")], "cmpl-9")
    assert [c["index"] for c in two["choices"]] == [0, 1] and two["usage"]["completion_tokens"] == 4 and two["id"] == "cmpl-9"
    assert two["usage"]["total_tokens"] == 9 and two["choices"][1]["finish_reason"] == "length"
