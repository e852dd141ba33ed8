"""Ollama's dialect without a model: an /api/chat, /api/generate or /api/embed body in, localrun's request out;
canned answer events in, Ollama's NDJSON out; refusals as {"error"} with Ollama's statuses and words, options
named as its clients name them."""

from __future__ import annotations

import json

import pytest
from dialect_fakes import FakeFacts, canned, final, written

from localrun.engine.types import TokenLogprob
from localrun.runtime.serving.scheduler import QueueFull
from localrun.serve.asked import Call, Image, ToolChoice
from localrun.serve.dialects import ollama
from localrun.serve.dialects.ollama_models import copy_request, create_request
from localrun.serve.errors import InvalidField, LoadFailed, Refused
from localrun.errors import ModelNotFound
from localrun.serve.stream import Event

HI = [{"role": "user", "content": "Hi"}]


def refused(data: dict, chat: bool = True) -> tuple[int, str]:
    with pytest.raises(Refused) as bad:
        ollama.asked_of({"model": "m", **data}, chat)
    status, body = ollama.error_answer(bad.value)
    return status, body["error"]


def test_a_chat_body_becomes_the_request(capsys):
    asked = ollama.asked_of({
        "model": "m", "keep_alive": "10m", "stream": False, "think": "high", "format": {"type": "object"}, "logprobs": True,
        "top_logprobs": 2, "max_output_tokens": 50, "frobnicate": 1,
        "options": {"temperature": 0.0, "num_predict": 12, "top_k": 1.0, "stop": ["\n"], "num_ctx": 2048, "num_gpu": 0,
                    "use_mmap": True, "logit_bias": {"5": 1}},
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "What is this?", "images": ["AAAA"]},
                     {"role": "assistant", "content": "", "thinking": "Add.", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1}}}]},
                     {"role": "tool", "content": "2", "tool_name": "add"}]}, chat=True)
    assert [(m.role, m.text) for m in asked.messages] == [("user", "What is this?"), ("assistant", ""), ("tool", "2")]
    assert asked.messages[0].images == [Image("data:image;base64,AAAA", "messages.0.images.0")]
    assert asked.messages[1].calls == [Call("add", {"a": 1})] and asked.messages[1].thinking == "Add." and asked.messages[2].name == "add"
    assert asked.sampling == {"temperature": 0.0, "top_k": 1} and asked.max_tokens == 12  # the body's options win over the top level
    assert asked.stops == ["\n"] and asked.load == {"ctx": 2048, "gpu_layers": "0"} and asked.keep_alive == "10m"
    assert (asked.think, asked.effort, asked.top_logprobs, asked.json_schema) == (True, "high", 2, {"type": "object"})
    assert asked.choice == ToolChoice() and asked.tools[0].name == "add"
    assert asked.strict and asked.drop_oldest and asked.truncate and not asked.reply.stream and not asked.reply.load_only
    said = capsys.readouterr().err
    assert "ignoring the field 'frobnicate'" in said and "ignoring the option 'logit_bias'" in said and "use_mmap" not in said


def test_generate_through_the_template_raw_or_to_fill_in_the_middle():
    templated = ollama.asked_of({"model": "m", "prompt": "Hi", "system": "Be brief.", "images": ["AAAA"], "context": [1, 2],
                                 "think": False, "format": "json"}, chat=False)
    assert [(m.role, m.text) for m in templated.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert templated.messages[1].images[0].name == "images.0" and templated.context == [1, 2]
    assert templated.plain_without_template and templated.json_object and templated.think is False and not templated.drop_oldest
    raw = ollama.asked_of({"model": "m", "prompt": "def f(", "suffix": "return 1", "logprobs": True}, chat=False)
    assert (raw.messages, raw.prompt, raw.suffix, raw.context, raw.top_logprobs) == (None, "def f(", "return 1", None, 0)
    assert not raw.truncate  # a fill-in-the-middle prompt is never cut (its markers would go)
    assert ollama.asked_of({"model": "m", "prompt": "Hi", "raw": True, "truncate": False}, chat=False).prompt == "Hi"


def test_an_empty_request_only_loads_the_model():
    assert ollama.asked_of({"model": "m"}, chat=True).reply.load_only
    assert ollama.asked_of({"model": "m", "messages": []}, chat=True).messages[0].text == ""
    assert ollama.asked_of({"model": "m", "prompt": ""}, chat=False).reply.load_only
    assert not ollama.asked_of({"model": "m", "prompt": "", "images": ["AAAA"]}, chat=False).reply.load_only


def test_whole_floats_for_whole_options_and_the_ai_sdks_tool_choice():
    asked = ollama.asked_of({"model": "m", "messages": HI, "options": {"num_predict": 3.0, "seed": 7.0, "num_predict_": None},
                             "tools": [{"type": "function", "function": {"name": "add"}}],
                             "tool_choice": {"type": "function", "function": {"name": "add"}}}, chat=True)
    assert asked.max_tokens == 3 and asked.sampling == {"seed": 7} and asked.choice == ToolChoice("function", name="add")
    assert ollama.asked_of({"model": "m", "messages": HI, "options": {"num_predict": -1}}, chat=True).max_tokens is None


@pytest.mark.parametrize("data, chat, says", [
    ({"messages": HI, "options": {"num_predict": 2.5}}, True, "options.num_predict"),
    ({"messages": HI, "options": {"temperature": "hot"}}, True, "invalid 'options.temperature'"),  # localrun's temperature
    ({"messages": HI, "options": {"num_ctx": 0.5}}, True, "invalid options.num_ctx"),
    ({"messages": [{"role": "robot", "content": "x"}]}, True, "invalid 'messages.0.role'"),
    ({"messages": [{"role": "user", "content": "x", "images": "AAAA"}]}, True, "messages.0.images must be a list"),
    ({"messages": HI, "format": "yaml"}, True, "invalid format 'yaml'"),
    ({"messages": HI, "think": "max"}, True, "invalid think 'max'"),
    ({"messages": HI, "stream": "yes"}, True, "stream must be true or false"),
    ({"messages": HI, "top_logprobs": 2}, True, "top_logprobs needs logprobs: true"),
    ({"messages": HI, "template": "{{ .Prompt }}"}, True, "template (the model's own chat template is used) is not supported"),
    ({"prompt": 3}, False, "prompt must be a string"),
    ({"prompt": "x", "context": "abc"}, False, "list of token ids"),
    ({"prompt": "x", "raw": True, "images": ["AAAA"]}, False, "images cannot combine with raw: true"),
])
def test_bad_bodies_are_ollamas_400s(data, chat, says):
    status, error = refused(data, chat)
    assert status == 400 and says in error, error


def test_a_model_is_required_and_errors_are_in_ollamas_words():
    assert refused({"model": None, "messages": HI})[1] == "model is required"
    status, body = ollama.error_answer(LoadFailed(ModelNotFound("no such model 'x'"), "x"), "x")
    assert status == 404 and body["error"] == 'model "x" not found, try pulling it first (no such model \'x\')'
    status, body = ollama.error_answer(QueueFull(64))
    assert status == 503 and body["error"].startswith("server busy, please try again. maximum pending requests exceeded")
    _, body = ollama.error_answer(InvalidField("use 1 or more", "max_tokens"))
    assert body["error"] == "invalid 'options.num_predict': use 1 or more"  # localrun's max_tokens, as the client wrote it


def test_embed_bodies():
    asked, texts, truncate, dimensions = ollama.embed_asked({"model": "m", "input": ["a", "b"], "truncate": False, "dimensions": 8,
                                                             "options": {"num_ctx": 512, "temperature": 1}}, legacy=False)
    assert (asked.model, asked.load, texts, truncate, dimensions) == ("m", {"ctx": 512}, ["a", "b"], False, 8)
    assert ollama.embed_asked({"model": "m", "prompt": ""}, legacy=True)[1] == []  # "" is no text, as Ollama's
    with pytest.raises(Refused):
        ollama.embed_asked({"model": "m", "input": [1]}, legacy=False)


def test_create_and_copy_bodies():
    name, made, stream = create_request({"model": "terse", "from": "smollm2", "system": "Be terse.",
                                         "parameters": {"temperature": 0, "stop": ["a", "b"]}, "stream": False})
    assert (name, made.base, made.system, stream) == ("terse", "smollm2", "Be terse.", False)
    assert made.parameters == [("temperature", "0"), ("stop", "a"), ("stop", "b")]
    assert copy_request({"source": "a", "destination": "b"}) == ("a", "b")
    with pytest.raises(Refused) as bad:
        create_request({"model": "x", "files": {"a": "sha256:1"}})
    assert "files" in bad.value.reason


def test_a_stream_in_ollamas_lines():
    facts = FakeFacts()
    events = canned(Event("ping"), Event("thinking", "Hm."), Event("text", "Hel", logprobs=[TokenLogprob(3, -0.2, [(3, -0.2)])]),
                    Event("text", "lo"), Event("tool_calls", calls=[{"id": "c", "name": "add", "arguments": {"a": 1}, "raw": "{}"}]),
                    Event("done", final=final("length", prompt=4, generated=2)))
    lines = [json.loads(line) for line in written(ollama.lines(events, "m", True, started=0.0, load_s=0.5, facts=facts,
                                                               logprobs=True, context=lambda text: [9, len(text)]))]
    assert lines[0]["message"] == {"role": "assistant", "content": ""} and lines[1]["message"]["thinking"] == "Hm."
    assert lines[2]["message"]["content"] == "Hel" and lines[2]["logprobs"] == [{"token": "t3", "logprob": -0.2,
                                                                                 "top_logprobs": [{"token": "t3", "logprob": -0.2}]}]
    assert lines[4]["message"]["tool_calls"] == [{"function": {"name": "add", "arguments": {"a": 1}}}]
    last = lines[-1]
    assert last["done"] and last["done_reason"] == "length" and last["context"] == [9, 5]  # the whole answer's text
    assert (last["prompt_eval_count"], last["eval_count"], last["load_duration"]) == (4, 2, 500000000)
    failed = [json.loads(line) for line in written(ollama.lines(canned(Event("failed", "boom")), "m", False, started=0.0, load_s=0))]
    assert failed == [{"error": "boom"}]


def test_a_whole_answer_and_the_names_models_are_listed_by():
    reply = ollama.final("m", False, "Hi", final("stop", prompt=3, generated=1), started=0.0, load_s=0.0, thinking="Hm.", context=[1])
    assert (reply["response"], reply["thinking"], reply["done_reason"], reply["context"]) == ("Hi", "Hm.", "stop", [1])
    message = ollama.with_tool_calls({"role": "assistant", "content": ""}, "", [{"name": "add", "arguments": {"a": 1}}])
    assert message["tool_calls"] == [{"function": {"name": "add", "arguments": {"a": 1}}}]
    assert ollama.loaded("m", True, "unload")["done_reason"] == "unload"
    assert [ollama.listed_name(n) for n in ("pirate", "pirate:latest", "owner/repo:Q4", "x.gguf")] == [
        "pirate:latest", "pirate:latest", "owner/repo:Q4", "x.gguf"]
