"""Tool-call reading (engine/formats, its lenient reader): what a model writes, in its family's format or in the
forms real models slip into (a fenced block, a bare object, doubled braces, several calls with text around
them), comes back as the same calls, whole or streamed in any pieces; text that is not a call stays text, and
streams out as it was written. Read as a Hermes-family model's answer (Qwen2.5's <tool_call>)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.engine.formats import AnswerStream, Message, ToolCall, family_for, parser_for, supports_tools
from localrun.engine.tools import call_schema

HERMES = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>"


def _parser(offered):
    return parser_for(HERMES, tools=[{"type": "function", "function": {"name": n}} for n in sorted(offered or ())])


def parse_tool_calls(text: str, offered) -> tuple[str, list[dict]]:
    m = _parser(offered).read(text)
    return m.content, [{"name": c.name, "arguments": json.loads(c.arguments)} for c in m.calls]

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
arguments = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=4)
calls = st.lists(st.fixed_dictionaries({"name": names, "arguments": arguments}), min_size=1, max_size=3)
prose = st.text(st.characters(blacklist_characters="{}[]<`", blacklist_categories=("Cs",)), max_size=30)

FORMS = ["hermes", "mistral", "mistral-args", "llama3", "generic", "fenced", "fenced-bare", "bare-in-a-row", "doubled", "hermes-fenced"]


def written(form: str, cs: list[dict]) -> str:
    """Calls as a model writes them in one of the forms."""
    if form == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in cs)
    if form == "hermes-fenced":
        return "\n".join(f"<tool_call>\n```json\n{json.dumps(c)}\n```\n</tool_call>" for c in cs)
    if form == "mistral":
        return "[TOOL_CALLS] " + json.dumps(cs)
    if form == "mistral-args":
        return "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{json.dumps(c['arguments'])}" for c in cs)
    if form == "llama3":
        return "<|python_tag|>" + json.dumps({"name": cs[0]["name"], "parameters": cs[0]["arguments"]})
    if form == "fenced":
        return "\n".join(f"```json\n{json.dumps(c, indent=2)}\n```" for c in cs)
    if form == "fenced-bare":
        return "\n\n".join(f"```\n{json.dumps(c)}\n```" for c in cs)
    if form == "bare-in-a-row":
        return "\n".join(json.dumps(c) for c in cs)
    if form == "doubled":  # Qwen's template prints its example call with doubled braces, and models copy it
        return "\n".join("{" + json.dumps(c) + "}" for c in cs)
    return json.dumps(cs if len(cs) > 1 else cs[0])


def streamed(text: str, cuts: list[int], offered) -> tuple[str, list[dict]]:
    """(the content a client assembles from the stream's deltas, the calls it assembles) for `text` fed in
    pieces; the calls' arguments grow as they are written and must add up to the whole call's."""
    stream, content, calls, last = AnswerStream(_parser(offered)), "", [], 0
    pieces = [stream.feed(text[last:cut]) for cut, last in zip(*_bounds(text, cuts))] + [stream.finish()]
    for deltas in pieces:
        for d in deltas:
            content += d.content
            if d.call_index is not None:
                while len(calls) <= d.call_index:
                    calls.append(ToolCall(""))
                calls[d.call_index].name = d.name or calls[d.call_index].name
                calls[d.call_index].arguments += d.arguments
    whole = stream.last
    if whole.calls or not calls:  # (a call that breaks after it began streaming was already announced: see below)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
    return content, [{"name": c.name, "arguments": json.loads(c.arguments)} for c in whole.calls]


def _bounds(text: str, cuts: list[int]) -> tuple[list[int], list[int]]:
    ends = sorted(set(c % (len(text) + 1) for c in cuts)) + [len(text)]
    return ends, [0, *ends[:-1]]


@settings(max_examples=300, deadline=None)
@given(form=st.sampled_from(FORMS), cs=calls, before=prose, after=prose, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_calls_come_back_as_written_whole_and_streamed(form, cs, before, after, cuts):
    expected = cs[:1] if form == "llama3" else cs
    around = form not in ("llama3", "mistral", "mistral-args")  # those markers run to the end of the answer
    text = (before + "\n" + written(form, expected) + "\n" + after) if around else written(form, expected)
    offered = {c["name"] for c in expected}
    content, parsed = parse_tool_calls(text, offered)
    assert parsed == expected
    if around:  # the text around the calls, trimmed (the answer's own first blanks kept: they went out as it streamed)
        assert content == "\n".join(p for p in (before.rstrip(), after.strip()) if p.strip())
    sent, found = streamed(text, cuts, offered)
    assert found == expected
    if around:
        assert sent.split() == (before + "\n" + after).split()
    else:
        assert sent.strip() == ""


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_text_that_is_no_call_stays_text_and_streams_whole(text, cuts):
    assert parse_tool_calls(text, {"get_weather"})[1] == [] or "get_weather" in text
    if "get_weather" not in text and "<tool_call>" not in text and "[TOOL_CALLS]" not in text and "<|python_tag|>" not in text:
        sent, found = streamed(text, cuts, {"get_weather"})
        assert found == [] and sent == text


def test_json_that_names_no_offered_tool_and_code_stay_text():
    offered = {"get_weather"}
    # ... and JSON naming one with keys no call has: an answer in a response_format schema (a helper saw
    # {"name": "get_weather", "age": 25} come back as a call with no arguments)
    for text in ['{"name": "Bob", "arguments": {}}', '{"answer": 4}', 'Use {"name": "x"} here', '{"name": "get_weather", "age": 25}',
                 '```python\nd = {"name": "get_weather", "arguments": {}}\n```', "The answer is {x} and [1].", "[1, 2]"]:
        assert parse_tool_calls(text, offered) == (text, []), text
        sent, found = streamed(text, [3, 9, 17], offered)
        assert found == [] and sent == text
    # code around a call is kept as content
    content, found = parse_tool_calls('Here:\n```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```\nDone.', offered)
    assert found == [{"name": "get_weather", "arguments": {"city": "Rome"}}] and content == "Here:\nDone."


def test_broken_calls_after_a_marker_stay_text():
    broken = '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>'
    assert parse_tool_calls(broken, {"f"}) == (broken, [])
    assert parse_tool_calls("Sure [TOOL_CALLS] not json", {"f"})[1] == []
    assert parse_tool_calls('{"name": "f", "arguments": "{\\"x\\": 2}"}', {"f"}) == ("", [{"name": "f", "arguments": {"x": 2}}])
    assert parse_tool_calls('{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}', {"f"}) == (
        "", [{"name": "f", "arguments": {"x": 1}}])
    # streamed, the call went out once its name was known; when it breaks, its text still comes as content
    sent, found = streamed(broken, [5, 20], {"f"})
    assert found == [] and sent == broken


def test_families_and_support_from_the_template():
    assert family_for("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert family_for("[TOOL_CALLS] {{ tools }}").name == "mistral"
    assert family_for("<|python_tag|>{{ tools }}").name == "llama-3"
    assert family_for("{{ messages }}").name == "plain" and family_for(None).name == "plain"
    assert supports_tools("{% if tools %}x{% endif %}") and not supports_tools("{{ messages }}") and not supports_tools(None)


def test_call_schema_names_the_function_and_takes_its_parameters():
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "b"}}]
    one = call_schema(tools, "a")
    assert one["properties"]["name"] == {"const": "a"} and one["properties"]["arguments"]["properties"]["x"]["type"] == "integer"
    either = call_schema(tools)
    assert [o["properties"]["name"]["const"] for o in either["anyOf"]] == ["a", "b"]
    several = call_schema(tools, parallel=True)
    assert several["type"] == "array" and several["minItems"] == 1 and several["items"] == either
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate({"name": "b", "arguments": {}}, either)
    jsonschema.validate([{"name": "b", "arguments": {}}, {"name": "a", "arguments": {"x": 1}}], several)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "c", "arguments": {}}, either)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], several)


def test_unevenly_doubled_braces_are_read_by_the_calls_shape():
    """Qwen2.5-Coder copies its template's {{"name": ...}} example and sometimes closes the braces unevenly."""
    text = '{{"name": "get_weather", "arguments": {"city": "Paris"}}\n{{"name": "get_weather", "arguments": {"city": "Rome"}}}}'
    expected = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert parse_tool_calls(text, {"get_weather"}) == ("", expected)
    assert streamed(text, [7, 30, 61], {"get_weather"}) == ("", expected)
    # one call, its brace doubled at the start only: no stray "{" before it as text (found by a helper), whole or streamed
    one = '{{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert parse_tool_calls(one, {"get_weather"}) == ("", expected[:1])
    assert streamed(one, [1, 2, 9], {"get_weather"}) == ("", expected[:1])
    assert parse_tool_calls("Here: " + one, {"get_weather"}) == ("Here:", expected[:1])


def test_a_list_of_calls_cut_short_keeps_the_calls_written_whole():
    """A forced list of calls (required, parallel) that max_tokens cuts: the whole calls come back."""
    text = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Ro'
    assert parse_tool_calls(text, {"get_weather"}) == ("", [{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert streamed(text, [10, 40], {"get_weather"})[1] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert parse_tool_calls("[1, 2", {"get_weather"}) == ("[1, 2", [])


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}}',
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n}',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}}\n```',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}}\n</tool_call>',
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}]]',
])
def test_a_closing_brace_too_many_after_a_call_is_the_calls(text):
    """Small models close one brace too many (seen from Qwen2.5-Coder-1.5B through Anthropic's API): the call
    still comes back, with no stray '}' as content (which Claude Code would print), and the tagged form is not
    taken for broken (it came back as its raw text, the call lost)."""
    call = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert parse_tool_calls(text, {"get_weather"}) == ("", call)
    assert streamed(text, [9, 30, 55], {"get_weather"}) == ("", call)
    # the text around it stays
    assert parse_tool_calls("Checking. " + text + "\nDone.", {"get_weather"}) == ("Checking.\nDone.", call)


def test_a_forced_call_keeps_the_references_of_its_parameters():
    """A tool whose parameters refer to their own $defs (every nested pydantic model, openai.pydantic_function_tool)
    can be forced: the references follow the parameters into the call's schema (they did not resolve there:
    tool_choice required or named was a 400; found by a helper)."""
    import jsonschema

    from localrun.engine.sampling import json_schema_grammar

    loc = {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"]}
    forecast = {"type": "object", "$defs": {"Loc": loc}, "required": ["city", "loc"],
                "properties": {"city": {"type": "string"}, "loc": {"$ref": "#/$defs/Loc"},
                               "near": {"type": "array", "items": {"$ref": "#/$defs/Loc"}}}}
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}  # refers to its own root
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": forecast}},
             {"type": "function", "function": {"name": "tree", "parameters": tree}}]
    for schema in (call_schema(tools, "forecast"), call_schema(tools, parallel=True)):
        json_schema_grammar(schema)  # every reference resolves
    several = call_schema(tools, parallel=True)
    jsonschema.validate([{"name": "forecast", "arguments": {"city": "Paris", "loc": {"lat": 48.8, "lon": 2.3}, "near": []}},
                         {"name": "tree", "arguments": {"kids": [{"kids": []}]}}], several)
    for wrong in ({"city": "Paris", "loc": {"lat": "north"}}, {"city": "Paris", "loc": {}, "near": [{"lat": 1}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "forecast", "arguments": wrong}], several)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "tree", "arguments": {"kids": [{"kids": 3}]}}], several)
    assert call_schema(tools[1:], "tree")["properties"]["arguments"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/tool0"}
