"""Tool-call parsing per template family (engine/tools.py): what a model writes in its family's format
comes back as the same calls, whatever the arguments; text that is not a well-formed call stays text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.engine.tools import call_schema, may_be_call, parse_tool_calls, supports_tools, template_family

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
arguments = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=4)
calls = st.lists(st.fixed_dictionaries({"name": names, "arguments": arguments}), min_size=1, max_size=3)


def written(family: str, cs: list[dict]) -> str:
    """Calls as a model of that family writes them."""
    if family == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in cs)
    if family == "mistral":
        return "[TOOL_CALLS] " + json.dumps(cs)
    if family == "llama3":
        return "<|python_tag|>" + json.dumps({"name": cs[0]["name"], "parameters": cs[0]["arguments"]})
    return json.dumps(cs if len(cs) > 1 else cs[0])


@settings(max_examples=150, deadline=None)
@given(family=st.sampled_from(["hermes", "mistral", "llama3", "generic"]), cs=calls)
def test_calls_come_back_as_written(family, cs):
    expected = cs[:1] if family == "llama3" else cs
    content, parsed = parse_tool_calls(written(family, expected), family)
    assert parsed == expected and content == ""
    assert may_be_call(written(family, expected)[:5], family)


def test_text_around_and_broken_calls():
    assert parse_tool_calls('Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', "hermes") == (
        "Let me check.", [{"name": "f", "arguments": {"x": 1}}])
    broken = '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>'
    assert parse_tool_calls(broken, "hermes") == (broken, [])
    assert parse_tool_calls("The answer is 4.", "hermes") == ("The answer is 4.", [])
    assert parse_tool_calls('{"name": "f", "arguments": "{\\"x\\": 2}"}', "generic") == ("", [{"name": "f", "arguments": {"x": 2}}])
    assert parse_tool_calls('{"answer": 4}', "generic") == ('{"answer": 4}', [])  # JSON, but no call
    assert parse_tool_calls("Sure [TOOL_CALLS] not json", "mistral")[1] == []
    assert not may_be_call("The weather", "hermes") and may_be_call("  <tool_", "hermes") and may_be_call("", "generic")


def test_families_and_support_from_the_template():
    assert template_family("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert template_family("[TOOL_CALLS] {{ tools }}") == "mistral"
    assert template_family("<|python_tag|>{{ tools }}") == "llama3"
    assert template_family("{{ messages }}") == "generic" and template_family(None) == "generic"
    assert supports_tools("{% if tools %}x{% endif %}") and not supports_tools("{{ messages }}") and not supports_tools(None)


def test_call_schema_names_the_function_and_takes_its_parameters():
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "b"}}]
    one = call_schema(tools, "a")
    assert one["properties"]["name"] == {"const": "a"} and one["properties"]["arguments"]["properties"]["x"]["type"] == "integer"
    either = call_schema(tools)
    assert [o["properties"]["name"]["const"] for o in either["anyOf"]] == ["a", "b"]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate({"name": "b", "arguments": {}}, either)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "c", "arguments": {}}, either)
