"""Tool calling end to end: a GGUF carrying a tool-capable chat template (Qwen 2.5's Hermes-style
template, written onto SmolLM2's weights with the gguf package) served by a real `localrun serve`, asked by
the real openai and ollama clients. A tiny model does not call tools by itself, so the calls asked for
with tool_choice "required" or a named function (a grammar from the function's schema) are what must
come back valid; the template must render tools, calls and results; a template without tools refuses a
required call and answers `auto` as text."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import openai
import pytest

from conftest import start_server

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"type": "string", "enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tools_model, tmp_path_factory):
    with start_server(tools_model, tmp_path_factory.mktemp("tools-home"), "--parallel", "2", "--ctx", "2048") as srv:
        yield srv


def client(server) -> openai.OpenAI:
    return server.client("none")


@pytest.fixture(scope="module")
def required_call(server, tools_model):
    """The greedy answer to ASK with tool_choice "required", asked once for the three tests that read it (each
    asked the same request of the same server)."""
    return client(server).chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice="required",
                                                  temperature=0, max_tokens=80)


def valid(call) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


ONLY_ADD = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]}}


@pytest.mark.parametrize("choice, name", [("required", None), ({"type": "function", "function": {"name": "add"}}, "add"),
                                          (ONLY_ADD, "add")])  # OpenAI's allowed_tools (it was a 400: found by a helper)
def test_forced_calls_validate_streamed_and_not(server, tools_model, choice, name, request):
    c = client(server)
    r = request.getfixturevalue("required_call") if choice == "required" else c.chat.completions.create(
        model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=80)
    choice0 = r.choices[0]
    assert choice0.finish_reason == "tool_calls" and choice0.message.content is None
    calls = choice0.message.tool_calls
    # a named function: that one call; required (or allowed_tools' required) with parallel calls: one or more, each
    # in its own <tool_call> as the template writes them
    assert len(calls) == 1 if isinstance(choice, dict) and choice.get("type") == "function" else len(calls) >= 1
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and (name is None or call.function.name == name)
        valid(call)
    chunks = list(c.chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice=choice,
                                            temperature=0, max_tokens=80, stream=True))
    deltas = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
    # each call streams as it is written (as llama-server streams it): its id and name first, then its arguments in
    # pieces that add up to the whole call's
    for i, call in enumerate(calls):
        mine = [d for d in deltas if d.index == i]
        assert mine[0].id and mine[0].function.name == call.function.name
        assert all(d.id is None and d.function.name is None for d in mine[1:]) and len(mine) > 2
        assert "".join(d.function.arguments for d in mine) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_call_with_a_response_format_is_the_call(server, tools_model, required_call):
    """A forced call beside a response_format (instructor's RESPONSES_TOOLS mode sends both; OpenAI takes the
    pair, it was a 400 here: a helper's run with the frameworks): the call, decoded by its own schema."""
    c = client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"x": {"type": "string"}}}}}
    r = c.chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                  max_tokens=80, response_format=fmt)
    alone = required_call  # the same request without the response_format
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function == alone.choices[0].message.tool_calls[0].function
    resp = c.responses.create(model=str(tools_model), input=ASK[-1]["content"], temperature=0, max_output_tokens=80,
                              tool_choice="required", text={"format": {"type": "json_schema", "name": "answer", "schema": fmt["json_schema"]["schema"]}},
                              tools=[{"type": "function", **t["function"]} for t in TOOLS])
    assert [item.type for item in resp.output] == ["function_call"], resp.output


def test_a_forced_call_ignores_stop_sequences(server, tools_model):
    """A stop inside the call would cut its JSON: the grammar ends a forced call, not the request's stops."""
    r = client(server).chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice="required",
                                               temperature=0, max_tokens=80, stop=["Paris", '"'])
    assert r.choices[0].finish_reason == "tool_calls"
    valid(r.choices[0].message.tool_calls[0])
    # Cut by max_tokens before the call is whole: no call and no content, not the grammar's half-written JSON
    # (it came back as content: found by a helper), streamed or not.
    cut = client(server).chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice="required",
                                                 temperature=0, max_tokens=6)
    assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.content and not cut.choices[0].message.tool_calls
    chunks = list(client(server).chat.completions.create(model=str(tools_model), messages=ASK, tools=TOOLS, tool_choice="required",
                                                         temperature=0, max_tokens=6, stream=True))
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_a_second_turn_with_the_tool_result(server, tools_model, required_call):
    c = client(server)
    first = required_call
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    second = c.chat.completions.create(model=str(tools_model), messages=history, tools=TOOLS, temperature=0, max_tokens=24)
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.content
    # The call and its result are in the prompt the template made.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_the_template_renders_tools_calls_and_results(tools_model):
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.prompt import render

    with Engine(tools_model, LoadOptions(n_ctx=512, n_threads=1)) as engine:
        text = render(engine, [*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 21}'}], tools=TOOLS).text
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in text and text.endswith("<|im_start|>assistant\n")


def test_a_template_without_tools(tiny_smollm2, tmp_path):
    """SmolLM2's own template renders no tools: `auto` is answered as the same request without tools. Served on the
    tiny model (tests/tinymodel.py: SmolLM2's tokenizer and template on random weights, a load of an eighth of the
    bytes), whose greedy answers are much alike: the prompt's tokens, counted, say that the tools were left out."""
    smollm2 = tiny_smollm2
    with start_server(smollm2, tmp_path / "home", "--parallel", "1", "--ctx", "1024") as srv:
        c = client(srv)
        auto = c.chat.completions.create(model=str(smollm2), messages=ASK, tools=TOOLS, temperature=0, max_tokens=8)
        plain = c.chat.completions.create(model=str(smollm2), messages=ASK, temperature=0, max_tokens=8)
        assert auto.choices[0].message.content == plain.choices[0].message.content and auto.choices[0].message.tool_calls is None
        assert auto.usage.prompt_tokens == plain.usage.prompt_tokens
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model=str(smollm2), messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=8)
        assert refused.value.body["param"] == "tool_choice" and "cannot render tools" in refused.value.body["message"]
        # Ollama's /api/chat refuses them, as Ollama does (the OpenAI dialect answers as text, as llama-server)
        ollama_chat = httpx.post(srv.url + "/api/chat", json={"model": str(smollm2), "messages": ASK, "tools": TOOLS, "stream": False})
        assert ollama_chat.status_code == 400 and "does not support tools" in ollama_chat.json()["error"], ollama_chat.text
    assert "has no tool support" in "".join(srv.stderr)  # said once, in the log


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {**ONLY_ADD, "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "nope"}}]}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"functions": [{"name": "f"}]}, "functions"),
    # a union's branch never shows in the path (pydantic's 'content.list[...].0'): the deepest branch speaks
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content.0"),  # not a data: URL
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages"),
])
def test_bad_tool_requests_are_400(server, tools_model, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={"model": str(tools_model), "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ollama_tool_calls_and_history(server, tools_model):
    from localrun.engine.tools import call_schema

    c = ollama.Client(host=server.url)
    assert "tools" in c.show(str(tools_model)).capabilities  # Ollama clients check it before sending tools
    # Ollama has no tool_choice: a format in the call's own schema makes the model write one, which comes
    # back as message.tool_calls as any call would.
    r = c.chat(model=str(tools_model), messages=ASK, tools=TOOLS, format=call_schema(TOOLS, "get_weather"),
               options={"temperature": 0, "num_predict": 80})
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER)
    streamed = list(c.chat(model=str(tools_model), messages=ASK, tools=TOOLS, format=call_schema(TOOLS, "get_weather"),
                           options={"temperature": 0, "num_predict": 80}, stream=True))
    assert [t.function.name for p in streamed for t in p.message.tool_calls or []] == ["get_weather"]
    follow = c.chat(model=str(tools_model), tools=TOOLS, options={"temperature": 0, "num_predict": 16}, messages=[
        *ASK, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}]},
        {"role": "tool", "content": '{"temperature": 21}', "tool_name": "get_weather"}])
    assert follow.done and follow.prompt_eval_count > r.prompt_eval_count
