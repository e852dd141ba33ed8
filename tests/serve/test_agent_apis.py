"""The APIs today's agents speak, against a real `localrun serve` with SmolLM2, through the official clients:
Anthropic's Messages API (the `anthropic` SDK: create, stream, tools with a second turn carrying the tool's
result, count_tokens, errors in Anthropic's shape) and OpenAI's Responses API (`openai`'s responses.create
and responses.stream: text, a function call round trip, json_schema, previous_response_id). Both are
translators into the chat request /v1/chat/completions serves: a greedy answer is the same text through
every dialect. Tools are asked of SmolLM2 carrying a tool template (it does not call tools by itself):
forced calls, which must validate."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from conftest import start_server, wait_until

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": False}
ASK = "What is the capital of France?"
GREEDY = {"temperature": 0}  # the anthropic SDK of today takes sampling options only as extra body fields


@pytest.fixture(scope="module")
def model(tools_model) -> Path:
    return tools_model


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    with start_server(model, tmp_path_factory.mktemp("agent-home"), "--parallel", "2", "--ctx", "2048", "--api-key", "sk-test") as srv:
        yield srv


def claude(server):
    import anthropic  # here, not at the top: importing it costs each pytest worker 1.6 s at collection

    return anthropic.Anthropic(base_url=server.url, api_key="sk-test", max_retries=0, timeout=120)


def oai(server) -> openai.OpenAI:
    return server.client("sk-test")


def test_the_same_greedy_answer_through_every_dialect(server, model):
    chat = oai(server).chat.completions.create(model=model.name, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=24)
    text = chat.choices[0].message.content
    msg = claude(server).messages.create(model=model.name, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": ASK}])
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == text
    assert msg.role == "assistant" and msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens > 0
    resp = oai(server).responses.create(model=model.name, input=ASK, temperature=0, max_output_tokens=24)
    assert resp.output_text == text and resp.status in ("completed", "incomplete") and resp.usage.output_tokens > 0
    ollama = httpx.post(server.url + "/api/chat", headers={"Authorization": "Bearer sk-test"}, timeout=120,
                        json={"model": model.name, "messages": [{"role": "user", "content": ASK}], "stream": False,
                              "options": {"temperature": 0, "num_predict": 24}}).json()
    assert ollama["message"]["content"] == text


def test_anthropic_stream_system_blocks_and_count_tokens(server, model):
    system = [{"type": "text", "text": "Answer in one word.", "cache_control": {"type": "ephemeral"}}]
    whole = claude(server).messages.create(model=model.name, max_tokens=16, extra_body=GREEDY, system=system,
                                           messages=[{"role": "user", "content": [{"type": "text", "text": ASK}]}],
                                           metadata={"user_id": "u1"})
    with claude(server).messages.stream(model=model.name, max_tokens=16, extra_body=GREEDY, system=system,
                                        messages=[{"role": "user", "content": ASK}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == whole.content[0].text and len(pieces) >= 1
    # streamed usage as a whole answer's: the cached part apart (the same prompt again, so some of it is cached)
    assert final.usage.cache_read_input_tokens > 0 and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    counted = claude(server).messages.count_tokens(model=model.name, system=system, messages=[{"role": "user", "content": ASK}])
    assert counted.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens > 10
    # a stop sequence, and Claude Code's extras (a system message inside messages, thinking, context_management) accepted
    cut = claude(server).messages.create(model=model.name, max_tokens=40, stop_sequences=["zebra", "Paris"],
                                         messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}],
                                         extra_body={**GREEDY, "thinking": {"type": "adaptive"}, "context_management": {}, "output_config": {}})
    assert "Paris" not in "".join(b.text for b in cut.content if b.type == "text")
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "Paris")  # which one, of several (it was null)
    # structured outputs, as messages.parse sends them: the answer in the schema (it was ignored: found by a helper)
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"],
              "additionalProperties": False}
    shaped = claude(server).messages.create(model=model.name, max_tokens=40, messages=[{"role": "user", "content": ASK}],
                                            extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    jsonschema.validate(json.loads(shaped.content[0].text), schema)


def test_anthropic_tools_round_trip(server, model):
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
             {"type": "web_search_20250305", "name": "web_search"}]  # a server tool: left out, not an error
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = claude(server).messages.create(model=model.name, max_tokens=60, extra_body=GREEDY, tools=tools, messages=ask,
                                           tool_choice={"type": "tool", "name": "get_weather"})
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    with claude(server).messages.stream(model=model.name, max_tokens=60, extra_body=GREEDY, tools=tools, messages=ask,
                                        tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    # any, with parallel calls allowed: one or more, the first the named one's (a later one cut by max_tokens stays
    # as it streamed, as Anthropic's own stream leaves a tool_use cut short)
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"][0] == (use.name, use.input)
    second = claude(server).messages.create(model=model.name, max_tokens=30, extra_body=GREEDY, tools=tools, messages=[
        *ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]}])
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"


def test_anthropic_errors_in_its_own_shape(server, model):
    import anthropic

    # Anthropic's models.list and retrieve read the same /v1/models (OpenAI's list, with Anthropic's fields too)
    listed = claude(server).models.list()
    assert model.name in [m.id for m in listed.data] and all(m.type == "model" and m.created_at for m in listed.data)
    assert claude(server).models.retrieve(model.name).display_name == model.name
    assert [m.id for m in oai(server).models.list().data] == [m.id for m in listed.data]
    # ... and their errors come in Anthropic's shape to Anthropic's clients (they were OpenAI's: found by a helper)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude(server).models.retrieve("no-such-model")
    assert unknown.value.body["type"] == "error" and unknown.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as locked:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).models.list()
    assert locked.value.body["error"]["type"] == "authentication_error" and "x-api-key" in locked.value.body["error"]["message"]
    with pytest.raises(openai.NotFoundError) as theirs:
        oai(server).models.retrieve("no-such-model")
    assert theirs.value.body["code"] == "model_not_found"

    with pytest.raises(anthropic.BadRequestError) as err:
        claude(server).messages.create(model=model.name, max_tokens=10, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert err.value.body["error"]["message"].startswith("messages.0.content.0: the model")  # no projector for it
    assert "has no image projector" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude(server).messages.create(model="no-such-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError) as denied:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=model.name, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    # Anthropic's shape and its header named (it was OpenAI's, asking for a Bearer token: found by a helper)
    assert denied.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "missing or wrong API key: send 'x-api-key: KEY'"}}
    wrong_method = httpx.put(server.url + "/v1/messages", headers={"x-api-key": "sk-test"})
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error", wrong_method.text


def test_responses_stream_function_call_round_trip_and_previous_response(server, model):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
             {"type": "web_search"}]  # Codex sends tools nothing here can run: left out
    first = oai(server).responses.create(model=model.name, input="What is the weather in Paris?", tools=tools,
                                         tool_choice={"type": "function", "name": "get_weather"}, temperature=0, store=False)
    [call] = [o for o in first.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with oai(server).responses.stream(model=model.name, input="What is the weather in Paris?", tools=tools,
                                      tool_choice="required", temperature=0) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    # the arguments streamed as they were written (response.function_call_arguments.delta, several), each call's
    # pieces adding up to its arguments; required with parallel calls: one or more, the first the named one's
    assert kinds.count("response.function_call_arguments.delta") > 2
    assert [(o.name, o.arguments) for o in streamed.output if o.type == "function_call"][0] == (call.name, call.arguments)
    second = oai(server).responses.create(model=model.name, temperature=0, max_output_tokens=30, tools=tools, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}])
    assert second.output[0].type == "message" and second.output_text
    follow = oai(server).responses.create(model=model.name, temperature=0, max_output_tokens=20, previous_response_id=second.id,
                                          input="And tomorrow?")
    # the Responses API's own count (it was a 405): the prompt the same body is answered with
    counted = oai(server).responses.input_tokens.count(model=model.name, previous_response_id=second.id, input="And tomorrow?")
    assert counted.object == "response.input_tokens" and counted.input_tokens == follow.usage.input_tokens
    alone = oai(server).responses.create(model=model.name, temperature=0, max_output_tokens=20, input="And tomorrow?")
    assert follow.usage.input_tokens > alone.usage.input_tokens + 20  # the earlier turns are in its prompt
    # the AI SDK's way (store: true): the earlier answer sent back by reference
    referred = oai(server).responses.create(model=model.name, temperature=0, max_output_tokens=2, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, {"type": "item_reference", "id": second.output[0].id},
        {"role": "user", "content": "And tomorrow?"}])
    assert referred.usage.input_tokens > alone.usage.input_tokens + 10
    with pytest.raises(openai.NotFoundError):
        oai(server).responses.create(model=model.name, input="hi", previous_response_id="resp_nope")


def test_responses_text_stream_and_json_schema(server, model):
    # The deltas add up to the final response's text, whether the model ends it or max_output_tokens does (this
    # tiny model's greedy answer ended by itself on Intel CPUs and ran on in a loop on an AMD EPYC).
    with oai(server).responses.stream(model=model.name, input=ASK, instructions="Answer briefly.", temperature=0,
                                      max_output_tokens=60) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert events[-1].type == {"completed": "response.completed", "incomplete": "response.incomplete"}[final.status]
    assert "".join(deltas) == final.output_text and deltas
    # Cut at max_output_tokens: the stream ends with response.incomplete, its message incomplete too, as
    # OpenAI's does (it ended with response.completed; found by a helper); sequence numbers count from 0.
    events = list(oai(server).responses.create(model=model.name, input=ASK, temperature=0, max_output_tokens=2, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert [o.status for o in events[-1].response.output] == ["incomplete"] and events[-1].response.completed_at is None
    whole = oai(server).responses.create(model=model.name, input=ASK, temperature=0, max_output_tokens=2)
    assert whole.status == "incomplete" and [o.status for o in whole.output] == ["incomplete"]
    # Errors name what the Responses client wrote, and a tool_choice that cannot be kept is refused.
    with pytest.raises(openai.BadRequestError) as bad:
        oai(server).responses.create(model=model.name, input=ASK, max_output_tokens=0)
    assert bad.value.body["param"] == "max_output_tokens" and "'max_output_tokens'" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        oai(server).responses.create(model=model.name, input=ASK, tool_choice="required")
    assert bad.value.body["param"] == "tool_choice"
    # An output for a call nobody made, and a Conversations API conversation, are refused as OpenAI's API refuses
    # the one and does not answer without the other (they were ignored: found by a helper).
    with pytest.raises(openai.BadRequestError) as bad:
        oai(server).responses.create(model=model.name, input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}])
    assert bad.value.body["param"] == "input.0" and "'call_nope'" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        oai(server).responses.create(model=model.name, input=ASK, conversation="conv_123")
    assert bad.value.body["param"] == "conversation" and "previous_response_id" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:  # a stored prompt template of OpenAI's platform (it was ignored)
        oai(server).responses.create(model=model.name, input=ASK, prompt={"id": "pmpt_123"})
    assert bad.value.body["param"] == "prompt"
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(server).messages.create(model=model.name, max_tokens=4, tool_choice={"type": "any"}, messages=[{"role": "user", "content": ASK}])
    assert "needs tools" in refused.value.body["error"]["message"]
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"], "additionalProperties": False}
    r = oai(server).responses.create(model=model.name, input=ASK, temperature=0, max_output_tokens=40,
                                     text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.status == "completed" and r.completed_at >= r.created_at
    # Logprobs asked as the Responses API asks for them (they were left out: found by a helper): each token of the
    # text part, with its alternatives, as chat's for the same answer; in the stream's deltas too
    asked = dict(model=model.name, input=ASK, temperature=0, max_output_tokens=6, top_logprobs=2, include=["message.output_text.logprobs"])
    whole = oai(server).responses.create(**asked)
    [part] = whole.output[0].content
    assert "".join(lp.token for lp in part.logprobs) == part.text and all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    chat = oai(server).chat.completions.create(model=model.name, messages=[{"role": "user", "content": ASK}], temperature=0,
                                                max_tokens=6, logprobs=True, top_logprobs=2)
    assert [(lp.token, round(lp.logprob, 4)) for lp in part.logprobs] == [(c.token, round(c.logprob, 4)) for c in chat.choices[0].logprobs.content]
    streamed = list(oai(server).responses.create(**asked, stream=True))
    assert [lp.token for e in streamed if e.type == "response.output_text.delta" for lp in e.logprobs] == [lp.token for lp in part.logprobs]
    assert streamed[-1].response.output[0].content[0].logprobs == part.logprobs and whole.top_logprobs == 2
    # A stream its client leaves mid-answer is kept as cancelled, with what it said so far (it was gone: a retrieve
    # by id and a previous_response_id found nothing; found by a helper)
    said = []
    with oai(server).responses.create(model=model.name, input="Count from one to a hundred.", temperature=0, max_output_tokens=400,
                                      stream=True) as stream:
        for e in stream:
            if e.type == "response.created":
                rid = e.response.id
            elif e.type == "response.output_text.delta":
                said.append(e.delta)
                if len(said) == 3:
                    break
    wait_until(lambda: oai(server).responses.retrieve(rid).status == "cancelled", what="the left response to be kept")
    kept = oai(server).responses.retrieve(rid)
    assert kept.output[0].content[0].text.startswith("".join(said)) and kept.output[0].status == "incomplete"
    follow = oai(server).responses.create(model=model.name, previous_response_id=rid, input="Go on.", max_output_tokens=2)
    assert follow.usage.input_tokens > 10


def test_a_long_prompt_is_not_silent(tiny_smollm2, tmp_path_factory, monkeypatch):
    """While a prompt is evaluated, each dialect's stream says it is alive (OpenCode gave up on 300 s of
    silence): an SSE comment on /v1/chat/completions and /v1/responses, Anthropic's ping event. The tiny model
    (tests/tinymodel.py): what it answers is not read, and its prompts are evaluated in a fraction of SmolLM2's
    time, so the pings come every 5 ms instead of 50, on prompts 12 times as long."""
    model = tiny_smollm2
    monkeypatch.setenv("LOCALRUN_PING_S", "0.005")
    with start_server(model, tmp_path_factory.mktemp("ping-home"), "--ctx", "8192") as srv:
        def long(n: int) -> str:  # some 3,300 tokens each (tens of pings), none a prefix of another
            return f"Summarise text {n}. " + "The quick brown fox jumps over the lazy dog. " * 300

        for path, body, alive in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": long(1)}], "max_tokens": 2}, ": keep-alive"),
            ("/v1/messages", {"messages": [{"role": "user", "content": long(2)}], "max_tokens": 2}, "event: ping"),
            ("/v1/responses", {"input": long(3), "max_output_tokens": 2}, ": keep-alive"),
        ]:
            with httpx.stream("POST", srv.url + path, json={"model": model.name, "stream": True, **body}, timeout=120) as r:
                text = "".join(r.iter_text())
            assert r.status_code == 200 and alive in text and text.count(alive) >= 2, (path, text[:300])
