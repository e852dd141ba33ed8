"""llama.cpp's chat parser cases, case by case: what models of each family write, and what localrun's parser for
that family (engine/formats) must read from it: the thinking, the answer, the tool calls. The cases are llama.cpp's
tests/test-chat.cpp, ported by scripts/port_llama_chat_cases.py into tests/data/llama_chat_cases.json (each one
run through llama.cpp's own chat code when the file was made, and read there as expected). Each is checked as
llama.cpp's test_peg_parser checks it:

- the prompt rendered for the case as llama.cpp renders it: its messages (else one user message), its tools, its
  enable_thinking; a case that continues a prefilled answer (continue_final_message) renders the earlier messages
  and ends with llama.cpp's own prefill (the generation prompt it recorded);
- the whole text read at once (a case marked partial is read as unfinished only);
- every prefix of the text (cut where UTF-8 allows) read as an unfinished message, and the deltas from one reading
  to the next added up: at each step they rebuild that reading, and at the end they are the expected message
  (what a streaming client assembles);
- where llama.cpp also re-renders the answer (expect_reconstruction), the read message rendered after the
  messages gives back the prompt and the text the model wrote.

Compared as llama.cpp compares: content and reasoning with surrounding whitespace stripped, calls by name, by
arguments as parsed JSON (keys in their order; text that is not JSON counts as ''), by id.
A case llama.cpp-internal is skipped from SKIPPED with why; a case localrun's parser does not read yet fails.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from localrun.engine.formats import Delta, Message, ToolCall, deltas, parser_for
from localrun.engine.prompt import render_template

DATA = Path(__file__).resolve().parent.parent / "data"
PORTED = json.loads((DATA / "llama_chat_cases.json").read_text(encoding="utf-8"))
CASES: list[dict] = PORTED["cases"]
USER = {"role": "user", "content": "Hey there!"}  # llama.cpp's message_user: a case without messages renders it

# llama.cpp builds one parser for every reasoning format but none (extract_reasoning = format != NONE);
# deepseek_legacy differed only in the server's streamed output (reasoning_in_content), a flag this llama.cpp sets
# and no code reads.
REASONING = {"none": "none", "auto": "auto", "deepseek": "auto", "deepseek_legacy": "auto"}

# Cases about llama.cpp-internal behaviour rather than what a model's text means: id -> why. None so far: every
# ported case reads a model's text (what test-chat.cpp checks besides, grammars and its own internals, is not in
# the data; see PORTED["not_ported"]).
SKIPPED: dict[str, str] = {}


@lru_cache(maxsize=None)
def template_text(name: str) -> str:
    return (DATA / "templates" / name).read_text(encoding="utf-8")


def prompt_for(case: dict) -> str:
    """The prompt llama.cpp's common_chat_templates_apply renders for the case (rendered here by localrun)."""
    messages = case["messages"] or [USER]
    common = {"tools": case["tools"], "enable_thinking": case["enable_thinking"]}
    if case["continue_final_message"]:  # the earlier messages, then the prefilled turn as llama.cpp opens it
        return render_template(template_text(case["template"]), messages[:-1], add_generation_prompt=False,
                               **common) + case["generation_prompt"]
    return render_template(template_text(case["template"]), messages,
                           add_generation_prompt=case["add_generation_prompt"], **common)


def reader(case: dict, prompt: str):
    extra: dict[str, Any] = {}
    if case["json_schema"] is not None:  # a response format: the answer is that JSON (llama.cpp strips a ```json fence)
        extra["json_schema"] = case["json_schema"]
    return parser_for(template_text(case["template"]), prompt,
                      tools=None if case["tool_choice"] == "none" else case["tools"],
                      reasoning=REASONING[case["reasoning_format"]], parallel=case["parallel_tool_calls"],
                      forced=case["tool_choice"] == "required", **extra)


def expected(case: dict) -> Message:
    e = case["expect"]
    return Message(content=e["content"], reasoning=e["reasoning"],
                   calls=[ToolCall(c["name"], c["arguments"], c["id"]) for c in e["tool_calls"]])


def stripped(text: str) -> str:
    return text.strip(" \t\n\v\f\r")  # C's isspace, as llama.cpp's string_strip


def normalized(arguments: str) -> Any:
    """Arguments as parsed JSON with the keys in their order; text that is not JSON (yet) as ''."""
    try:
        return json.loads(arguments, object_pairs_hook=lambda pairs: ("object", pairs))
    except ValueError:
        return ""


def differences(want: Message, got: Message) -> list[str]:
    """What differs, as llama.cpp's assert_msg_equals(..., ignore_whitespace_differences=true) sees it."""
    out = []
    if stripped(want.content) != stripped(got.content):
        out.append(f"content {got.content!r}, expected {want.content!r}")
    if stripped(want.reasoning) != stripped(got.reasoning):
        out.append(f"reasoning {got.reasoning!r}, expected {want.reasoning!r}")
    if len(want.calls) != len(got.calls):
        out.append(f"{len(got.calls)} calls {got.calls!r}, expected {len(want.calls)}: {want.calls!r}")
        return out
    for i, (w, g) in enumerate(zip(want.calls, got.calls)):
        if w.name != g.name:
            out.append(f"call {i} named {g.name!r}, expected {w.name!r}")
        if normalized(w.arguments) != normalized(g.arguments):
            out.append(f"call {i} arguments {g.arguments!r}, expected {w.arguments!r}")
        if w.id != g.id:
            out.append(f"call {i} id {g.id!r}, expected {w.id!r}")
    return out


def utf8_safe_length(data: bytes) -> int:
    """test-chat.cpp's utf8_truncate_safe_len: the prefix's length without a trailing incomplete character."""
    n = len(data)
    i = n
    for _ in range(4):
        if i == 0:
            return n
        i -= 1
        c = data[i]
        if c & 0x80 == 0:
            return n
        if c & 0xC0 == 0xC0:
            if c & 0xE0 == 0xC0:
                width = 2
            elif c & 0xF0 == 0xE0:
                width = 3
            elif c & 0xF8 == 0xF0:
                width = 4
            else:
                return i
            return n if n - i >= width else i
    return n - min(n, 3)


def add(built: Message, delta: Delta) -> None:
    """A delta applied as llama.cpp's test applies it (and a streaming client would): text appended, a call's
    name and id set when the delta carries them, its arguments appended."""
    built.reasoning += delta.reasoning
    built.content += delta.content
    if delta.call_index is not None:
        while len(built.calls) <= delta.call_index:
            built.calls.append(ToolCall(""))
        call = built.calls[delta.call_index]
        call.name = delta.name or call.name
        call.id = delta.id or call.id
        call.arguments += delta.arguments


def streamed(parser, text: str, partial: bool) -> Message:
    """Every prefix read in turn, the deltas between readings added up; each reading checked against the sum."""
    data = text.encode("utf-8")
    before, built = Message(), Message()
    for i in range(1, len(data) + 1):
        cut = utf8_safe_length(data[:i])
        now = parser.parse(data[:cut].decode("utf-8"), partial=i < len(data) or partial)
        for delta in deltas(before, now):
            add(built, delta)
        wrong = differences(now, built)
        assert not wrong, (f"after {cut} of {len(data)} bytes ({data[:cut].decode('utf-8')!r}) the deltas add up to "
                           f"another message than the reading: {'; '.join(wrong)}")
        before = copy.deepcopy(now)
    return built


def case_param(case: dict):
    marks = [pytest.mark.skip(reason=SKIPPED[case["id"]])] if case["id"] in SKIPPED else []
    return pytest.param(case, id=case["id"], marks=marks)


def described(case: dict, prompt: str) -> str:
    head = f"{case['id']} (test-chat.cpp:{case['cpp_line']}), the model wrote {case['input']!r}"
    if not case["continue_final_message"] and not prompt.endswith(case["generation_prompt"]):
        head += (f"\n  note: the prompt ends {prompt[-60:]!r}, llama.cpp's ended {case['generation_prompt']!r}"
                 " (a difference in rendering)")
    return head


@pytest.mark.parametrize("case", [case_param(c) for c in CASES])
def test_case(case: dict) -> None:
    prompt = prompt_for(case)
    parser = reader(case, prompt)
    want = expected(case)
    if not case["is_partial"]:
        wrong = differences(want, parser.parse(case["input"], partial=False))
        assert not wrong, f"{described(case, prompt)}\n  read whole: " + "; ".join(wrong)
    wrong = differences(want, streamed(parser, case["input"], case["is_partial"]))
    assert not wrong, f"{described(case, prompt)}\n  streamed: " + "; ".join(wrong)


@pytest.mark.parametrize("case", [case_param(c) for c in CASES if c["expect_reconstruction"] and not c["is_partial"]])
def test_reconstruction(case: dict) -> None:
    """The expected message (its calls' argument text as read), rendered after the case's messages without a
    generation prompt, starts with the prompt and the text the model wrote: reading and rendering agree."""
    prompt = prompt_for(case)
    read = reader(case, prompt).parse(case["input"])
    e = case["expect"]
    message: dict[str, Any] = {"role": "assistant", "content": e["content"]}
    if e["reasoning"]:
        message["reasoning_content"] = e["reasoning"]
    if e["tool_calls"]:
        message["tool_calls"] = []
        for i, call in enumerate(e["tool_calls"]):
            arguments = read.calls[i].arguments if i < len(read.calls) else call["arguments"]
            entry: dict[str, Any] = {"type": "function", "function": {"name": call["name"], "arguments": arguments}}
            if call["id"]:
                entry["id"] = call["id"]
            message["tool_calls"].append(entry)
    rendered = render_template(template_text(case["template"]), (case["messages"] or [USER]) + [message],
                               tools=case["tools"], add_generation_prompt=False,
                               enable_thinking=case["enable_thinking"])
    written = prompt + case["input"]
    at = next((i for i, (a, b) in enumerate(zip(rendered, written)) if a != b), min(len(rendered), len(written)))
    around = slice(max(0, at - 40), at + 40)
    assert rendered.startswith(written), (f"{case['id']}: the read message renders as {rendered[around]!r} where "
                                          f"the model wrote {written[around]!r}")


# --- compute_diffs (test-chat.cpp's test_msg_diffs_compute) ---------------------------------------------------


def test_deltas_of_new_content() -> None:
    assert deltas(Message(), Message(content="Hello, world!")) == [Delta(content="Hello, world!")]


def test_deltas_of_grown_content() -> None:
    assert deltas(Message(content="Hello,"), Message(content="Hello, world!")) == [Delta(content=" world!")]


def test_deltas_of_a_call_growing() -> None:
    """A new call comes whole (name, id, the arguments so far); then only what its arguments grew by."""
    first = Message(calls=[ToolCall("special_function", '{"ar', "123")])
    then = Message(calls=[ToolCall("special_function", '{"arg1": 1}', "123")])
    assert deltas(Message(), first) == [Delta(call_index=0, name="special_function", id="123", arguments='{"ar')]
    assert deltas(first, then) == [Delta(call_index=0, arguments='g1": 1}')]


def test_deltas_of_two_new_calls() -> None:
    both = Message(calls=[ToolCall("f1", '{"arg1": 1}', "123"), ToolCall("f2", '{"arg2": 2}', "222")])
    assert deltas(Message(), both) == [Delta(call_index=0, name="f1", id="123", arguments='{"arg1": 1}'),
                                       Delta(call_index=1, name="f2", id="222", arguments='{"arg2": 2}')]


# --- the data itself ----------------------------------------------------------------------------------------

# Inputs transcribed by hand from test-chat.cpp's C++ literals (escapes, raw strings, concatenation, UTF-8): the
# generated JSON must hold exactly these.
BY_HAND = {
    "deepseek-ai-DeepSeek-V3.1/003-reasoning-call":
        "REASONING</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
        "\"Tokyo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek-ai-DeepSeek-V3.2/002-thinking-tool-call-single-string-param":
        "Let me check the time</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        "</｜DSML｜function_calls>",
    "Qwen3-Coder/007-test-with-code-content-asian-unicode":
        "<tool_call>\n<function=python>\n<parameter=code>\n格\n</parameter>\n</function>\n</tool_call>",
    "Spark2.5/005-content-6-calls":
        "Preparing updates.<tool_call>magic_int<arg_key>ref</arg_key><arg_value>42</arg_value><arg_key>name</arg_key>"
        "<arg_value>上海</arg_value></tool_call><tool_call>amount<arg_key>orig</arg_key><arg_value>2.5</arg_value>"
        "</tool_call><tool_call>toggle<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>"
        "<tool_call>set_config<arg_key>config</arg_key><arg_value>{\"source\": \"spark\", \"options\": "
        "{\"strict\": true}}</arg_value></tool_call><tool_call>nested_args<arg_key>tags</arg_key>"
        "<arg_value>[\"alpha\", \"测试\"]</arg_value><arg_key>entries</arg_key><arg_value>[{\"id\": 1, \"label\": "
        "\"first\"}, {\"id\": 2, \"label\": \"第二\"}]</arg_value></tool_call><tool_call>empty_args</tool_call>",
    "LFM2-8B-A1B/009-newline-emitted-as-a-json-n":  # C++ "\\n": a backslash and an n, for the model's Python
        "<|tool_call_start|>[python(code=\"def hello():\\n    print('hey')\")]<|tool_call_end|>",
    "LFM2-8B-A1B/011-escaped-quotes-inside-a-string-argument":
        "<|tool_call_start|>[python(code=\"print(\\\"hi\\\")\")]<|tool_call_end|>",
    "Kimi-K2-Thinking/006-python-tool-with-multiline-code":
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.python:0<|tool_call_argument_begin|>"
        "{\"code\": \"def hello():\\n    print(\\\"Hello, world!\\\")\\n\\nhello()\"}<|tool_call_end|>"
        "<|tool_calls_section_end|>",
    "mistralai-Ministral-3-14B-Reasoning-2512/007-fake-tool-call-marker-in-reasoning":  # a "..." then an R"(...)"
        "[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{\"arg1\":1} and more[/THINK]"
        "[TOOL_CALLS]special_function[ARGS]{\"arg1\": 1}",
    "Qwen3.5-4B/007-value-ending-on-a-delimiter-prefix":
        "<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n</parameter>\n<parameter=oldString>\n#iclunde\n"
        "</parameter>\n<parameter=newString>\n#include\n\n</parameter>\n</function>\n</tool_call>",
    "ByteDance-Seed-OSS/005-tool-call-with-inside-quotes":
        "<seed:tool_call>\n<function=edit>\n<parameter=filename>foo.cpp</parameter>\n<parameter=oldString>"
        "def foo(arg = \"14\"):\n    return arg + \"bar\"\n</parameter>\n<parameter=newString>"
        "def foo(arg = \"15\"):\n    pass\n</parameter>\n</function>\n</seed:tool_call>",
    "google-gemma-4-31B-it/005-tool-call-with-string-argument-containing":
        "<|tool_call>call:get_time{city:<|\"|>San Francisco<|\"|>}<tool_call|>",
}


@pytest.mark.parametrize("case_id", sorted(BY_HAND))
def test_inputs_are_as_written_in_the_cpp(case_id: str) -> None:
    case = next(c for c in CASES if c["id"] == case_id)
    assert case["input"].encode("utf-8") == BY_HAND[case_id].encode("utf-8")


def test_the_data_names_real_templates_and_whole_cases() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)) == 463
    for case in CASES:
        assert (DATA / "templates" / case["template"]).is_file(), case["template"]
        assert case["reasoning_format"] in REASONING and case["tool_choice"] in ("auto", "required", "none")
        assert case["generation_prompt"] is not None, case["id"]
        for tool in case["tools"] or []:
            assert tool["type"] == "function" and set(tool["function"]) == {"name", "description", "parameters"}
        for call in case["expect"]["tool_calls"]:
            assert isinstance(call["arguments"], str) and isinstance(call["id"], str)


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["where"],
                                                marks=pytest.mark.skip(reason=f"{e['what']}: {e['reason']}"))
                                   for e in PORTED["not_ported"]])
def test_not_ported(entry: dict) -> None:
    """What of llama.cpp's chat tests is not here, each shown as a skip with why (never dropped silently)."""
