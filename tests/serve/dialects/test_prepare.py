"""localrun's request (serve.asked.Asked) made the runtime Request a model answers, against made-up model facts (a
real chat template, a made-up vocabulary): what each dialect shares after its translator, without a model."""

from __future__ import annotations

import pytest
from dialect_fakes import FakeFacts

from localrun.engine.sampling import OptionError
from localrun.runtime import SamplingOptions
from localrun.runtime.images import BadImage
from localrun.serve.asked import Asked, Call, Image, Message, Tool, ToolChoice
from localrun.serve.errors import Refused
from localrun.serve.prepare import prepared

ADD = Tool({"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}})
SUB = Tool({"name": "sub"})
HI = [Message("user", "Hi")]


def field_of(asked: Asked, facts: FakeFacts = None) -> str:
    with pytest.raises(Refused) as refused:
        prepared(asked, facts or FakeFacts())
    return refused.value.field


def test_a_conversation_with_its_tools_and_thinking():
    asked = Asked(messages=[Message("system", "Be brief."), Message("assistant", "", calls=[Call("add", '{"a": 1}', "c1")], thinking="Hm."),
                            Message("tool", "2", call_id="c1", name="add"), Message("user", "Hi")],
                  tools=[ADD], effort="none", template_kwargs={"x": 1}, stops=["END"], sampling={"temperature": 0.1, "seed": 2**40},
                  logit_bias={5: -1.0}, max_tokens=20, top_logprobs=2, draft_max=0)
    request, tooling = prepared(asked, FakeFacts())
    assert request.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}], "reasoning_content": "Hm."}
    assert request.messages[2] == {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "add"}
    assert request.tools == [ADD.for_template()] and tooling.names == {"add"} and tooling.forced is None
    assert request.think is False and request.template_kwargs == {"x": 1, "reasoning_effort": "none"}  # "none": no thinking
    options = request.sampling
    assert options.stop == ["END"] and options.temperature == 0.1 and options.seed == 2**40 % (2**32 - 1)
    assert options.logit_bias == {5: -1.0} and options.max_tokens == 20
    assert (request.top_logprobs, request.draft_max, request.truncate, request.drop_oldest) == (2, 0, False, False)


def test_unasked_the_length_is_the_slots_and_the_models_own_stops_stay():
    request, _ = prepared(Asked(messages=HI), FakeFacts(sampling=SamplingOptions(stop=["\n\n"])))
    assert request.sampling.max_tokens == -1 and request.sampling.stop == ["\n\n"]
    request, _ = prepared(Asked(messages=HI, stops=["x"]), FakeFacts(sampling=SamplingOptions(max_tokens=64, stop=["\n\n"])))
    assert request.sampling.max_tokens == 64 and request.sampling.stop == ["\n\n", "x"]  # a Modelfile's length is kept


def test_a_forced_call_is_a_grammar_and_cannot_take_another():
    request, tooling = prepared(Asked(messages=HI, tools=[ADD, SUB], choice=ToolChoice("function", name="add")), FakeFacts())
    assert tooling.grammar is not None or tooling.forced is not None
    assert request.sampling.stop == [] and request.sampling.max_tokens == -1
    allowed = Asked(messages=HI, tools=[ADD, SUB], choice=ToolChoice("required", allowed=("sub",)))
    _, tooling = prepared(allowed, FakeFacts())
    assert tooling.names == {"sub"} and tooling.parser.tools.only  # offered both, only sub may be called
    assert field_of(Asked(messages=HI, tools=[ADD], choice=ToolChoice("required"), sampling={"grammar": 'root ::= "x"'})) == "tool_choice"


@pytest.mark.parametrize("asked", [
    Asked(messages=HI, choice=ToolChoice("required")),  # no tools to call
    Asked(messages=HI, tools=[ADD], choice=ToolChoice("function", name="nope")),
    Asked(messages=HI, tools=[ADD], choice=ToolChoice("required", allowed=("nope",))),
    Asked(messages=HI, tools=[ADD], choice=ToolChoice("sometimes", allowed=("add",))),
])
def test_a_tool_choice_that_cannot_be_kept(asked):
    assert field_of(asked) == "tool_choice"


def test_a_template_without_tools_answers_as_text_unless_the_dialect_refuses_them(capsys):
    plain = FakeFacts("google-gemma-2-2b-it")
    request, tooling = prepared(Asked(messages=HI, tools=[ADD]), plain)
    assert tooling is None and request.tools is None and "has no tool support" in capsys.readouterr().err
    assert field_of(Asked(messages=HI, tools=[ADD], choice=ToolChoice("required")), plain) == "tool_choice"
    assert field_of(Asked(model="gemma", messages=HI, tools=[ADD], strict=True), plain) == "tools"  # Ollama's
    with pytest.raises(Refused) as no_thinking:
        prepared(Asked(model="gemma", messages=HI, think=True, strict=True), plain)
    assert no_thinking.value.reason == '"gemma" does not support thinking'
    prepared(Asked(messages=HI, think=True), plain)  # /v1's switch for a template without one: nothing to switch


@pytest.mark.parametrize("asked, field", [
    (Asked(messages=HI, stops=[""]), "stop"),
    (Asked(messages=HI, logit_bias={99999: 1.0}), "logit_bias"),
    (Asked(messages=HI, json_schema={"type": "object", "properties": {"a": {"type": "bogus"}}}), "response_format"),
    (Asked(messages=HI, json_object=True, ignore_eos=True), "ignore_eos"),
    (Asked(messages=HI, effort="extreme"), "reasoning_effort"),
    (Asked(messages=HI, context=[5, 10**6]), "context"),
    (Asked(prompt=""), "prompt"),
    (Asked(prompt=[1, 2000]), "prompt"),
    (Asked(prompt=[1], suffix="x"), "suffix"),
    (Asked(prompt="def f(", suffix="x"), "suffix"),  # no fill-in-the-middle tokens
    (Asked(messages=[Message("assistant", "", calls=[Call("add", "{oops")])]), "messages"),
])
def test_what_the_model_cannot_take_is_refused_naming_the_field(asked, field):
    assert field_of(asked) == field


def test_a_sampling_value_is_refused_by_the_options_merge_naming_it():
    with pytest.raises(OptionError) as bad:
        prepared(Asked(messages=HI, sampling={"temperature": -1.0}), FakeFacts())
    assert bad.value.field == "temperature"


def test_prompts_as_they_are():
    request, _ = prepared(Asked(prompt="Once"), FakeFacts())
    assert request.raw and request.messages == [{"role": "user", "content": "Once"}]
    assert prepared(Asked(prompt=[1, 2, 3]), FakeFacts())[0].tokens == [1, 2, 3]
    fim, _ = prepared(Asked(prompt="ab", suffix="c"), FakeFacts(infill=True))
    assert fim.tokens == [1, 97, 98, 2, 99, 3]
    ignoring, _ = prepared(Asked(prompt="x", ignore_eos=True, max_tokens=5), FakeFacts())
    assert ignoring.sampling.min_tokens == 5


def test_ollamas_generate_on_a_model_without_a_template_and_its_context():
    asked = Asked(messages=[Message("system", "Be brief."), Message("user", "Hi")], plain_without_template=True, context=[7],
                  truncate=True, think=True, top_logprobs=1)
    request, _ = prepared(asked, FakeFacts(template=None))
    assert request.raw and request.messages == [{"role": "user", "content": "Be brief.\n\nHi"}] and request.context is None
    assert request.truncate and request.top_logprobs == 1
    templated, _ = prepared(asked, FakeFacts())
    assert templated.context == [7] and [m["role"] for m in templated.messages] == ["system", "user"]
    with_image = Asked(messages=[Message("user", "Hi", images=[Image("https://example.com/cat.png", "images.0")])], plain_without_template=True)
    with pytest.raises(BadImage) as bad:  # stays a conversation: the image is read, and named as the client wrote it
        prepared(with_image, FakeFacts(template=None))
    assert bad.value.name == "images.0"


def test_a_conversation_over_the_context_drops_its_oldest_only_when_asked():
    assert prepared(Asked(messages=HI, drop_oldest=True), FakeFacts())[0].drop_oldest
    assert not prepared(Asked(prompt="x", drop_oldest=True), FakeFacts())[0].drop_oldest  # a prompt has no messages to drop


def test_the_servers_reasoning_defaults_and_a_requests_own_win_key_by_key():
    from localrun.runtime.request import TemplateDefaults

    served = FakeFacts(template_defaults=TemplateDefaults(think=False, effort="low", kwargs={"a": 1, "b": 2}))
    request, _ = prepared(Asked(messages=HI), served)
    assert request.think is False and request.template_kwargs == {"a": 1, "b": 2, "reasoning_effort": "low"}
    request, _ = prepared(Asked(messages=HI, think=True, effort="high", template_kwargs={"b": 3}), served)
    assert request.think is True and request.template_kwargs == {"a": 1, "b": 3, "reasoning_effort": "high"}
    request, _ = prepared(Asked(messages=HI), FakeFacts())  # none given: the template's own default
    assert request.think is None and request.template_kwargs == {}
