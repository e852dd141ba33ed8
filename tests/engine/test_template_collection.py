"""Every chat template of llama.cpp's collection (tests/data/templates/, its models/templates/) renders what a
client sends as llama.cpp renders it (engine.prompt.render_template, no model needed): a plain chat, a system
prompt, tools offered, a second turn carrying an assistant's tool call (an OpenAI client's id) and its result,
and earlier turns' reasoning written back where the template writes it. What a template cannot take is data
here, with the reason (the template's own refusal comes out as TemplateError, a 400 at the HTTP edge). And a
conversation that only grew renders a prompt that starts with the one before (its KV cache reused), a system
message in the middle of it included (issue 54: it was hoisted to the top, 10k tokens evaluated again)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from localrun.engine.prompt import _short_id, compile_template, render_template, template_caps
from localrun.errors import TemplateError, UsageError

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL_ID = "call_abc123DEF456ghi789JKL0"  # as OpenAI and its clients write them
USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
RESULT = {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"sky": "clear"}'}
REASONING = "Reasoning-7Q: the user wants the weather"

# Templates with no place for the tools offered: llama.cpp renders the prompt without them too (and localrun's
# server answers such a request as text, saying so once).
NO_TOOLS = {
    "HuggingFaceTB-SmolLM3-3B": "this version of the template writes no tools",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "writes tool calls but not the tools offered",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "writes tool calls but not the tools offered",
    "deepseek-ai-DeepSeek-V3.1": "the tools are the client's to describe in its system prompt",
    "google-gemma-2-2b-it": "no tool support",
    "llama-cpp-rwkv-world": "no tool support",
    "microsoft-Phi-3.5-mini-instruct": "no tool support",
}
# Templates that do not write an assistant's tool calls (the turn renders; the call is not in it).
NO_CALLS = {
    "HuggingFaceTB-SmolLM3-3B": "no tool support in this version",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "writes an empty turn for them",
    "LFM2-8B-A1B": "the call is expected in the assistant's content, as the model wrote it",
    "LFM2.5-Instruct": "the call is expected in the assistant's content, as the model wrote it",
    "ibm-granite-granite-3.3-2B-Instruct": "the call is expected in the assistant's content, as the model wrote it",
    "llama-cpp-rwkv-world": "no tool support",
    "microsoft-Phi-3.5-mini-instruct": "no tool support",
}
NO_TOOL_RESULTS = {"llama-cpp-rwkv-world", "microsoft-Phi-3.5-mini-instruct"}  # write no tool messages either
# The template's own refusal, as TemplateError with its message.
REFUSES_TOOL_TURN = {"google-gemma-2-2b-it": "Conversation roles must alternate"}  # no tool role: raise_exception

# Templates that write an earlier answer's reasoning_content back: in the ongoing tool loop (after the last user
# message: Qwen3's <think>, gpt-oss's analysis channel, Kimi K2 Thinking, GLM 4.7, MiniMax M2 interleaved
# thinking...), and those that keep it in the history before the last user message too. DeepSeek V3.1's template
# writes neither (an empty <think></think>), nor do the templates of models that do not reason.
REASONING_IN_LOOP = {
    "Bielik-11B-v3.0-Instruct", "ByteDance-Seed-OSS", "Cohere2MoE", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "GLM-4.6", "GLM-4.7-Flash", "Kimi-K2-Thinking", "Kimi-K3", "LFM2.5-8B-A1B", "MiniMax-M2", "MiniMax-M3",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "Reka-Edge", "Spark2.5", "StepFun3.5-Flash",
    "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4", "deepseek-ai-DeepSeek-V4-Flash-0731",
    "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved", "inclusionai-ling-3.0-flash",
    "mistralai-Ministral-3-14B-Reasoning-2512", "muse-glimmer", "openai-gpt-oss-120b", "openbmb-MiniCPM5-1B",
    "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2", "tencent-Hy3",
}
REASONING_IN_HISTORY = {  # (preserve_reasoning on, as llama-server's default: GLM 4.7, Nemotron 3, DeepSeek V4 keep it)
    "Bielik-11B-v3.0-Instruct", "ByteDance-Seed-OSS", "Cohere2MoE", "GLM-4.7-Flash", "Kimi-K3", "LFM2.5-8B-A1B",
    "MiniMax-M3", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Spark2.5", "deepseek-ai-DeepSeek-V4",
    "deepseek-ai-DeepSeek-V4-Flash-0731", "inclusionai-ling-3.0-flash", "mistralai-Ministral-3-14B-Reasoning-2512",
    "muse-glimmer", "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2",
}

# A conversation that grew renders a prompt that starts with the one before it, except where the template itself
# rewrites what came before:
GROWS_EXCEPT = {  # with a system message in the middle
    "CohereForAI-c4ai-command-r-plus-tool_use": "writes its instructions after the last message",
    "mistralai-Mistral-Nemo-Instruct-2407": "writes the system prompt into the last user message",
}
GROWS_IN_TOOL_LOOP_EXCEPT = {  # through a tool call, its result and the answer, with reasoning, then a new question
    **GROWS_EXCEPT,
    "Mistral-Small-3.2-24B-Instruct-2506": "writes the tools before the last user message",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "ends a tool result differently once a message follows it",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "ends a tool result differently once a message follows it",
    "Bielik-11B-v3.0-Instruct": "ends a tool result differently once an answer follows it",
    "google-gemma-2-2b-it": "refuses a tool message",
    # the loop's reasoning dropped once a new question comes (it is written only after the last user message):
    **{name: "drops the loop's reasoning at the next question" for name in (
        "GLM-4.6", "Kimi-K2-Thinking", "MiniMax-M2", "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "Reka-Edge", "StepFun3.5-Flash",
        "deepseek-ai-DeepSeek-V3.2", "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved", "openai-gpt-oss-120b",
        "openbmb-MiniCPM5-1B")},
}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def render(name: str, messages, tools=None, **kwargs) -> str:
    return render_template(template(name), json.loads(json.dumps(messages)), tools=tools, bos_token="<s>",
                           eos_token="</s>", **kwargs)


def test_the_collection_is_whole():
    assert len(NAMES) == 70
    assert set(NO_TOOLS) | set(NO_CALLS) | REASONING_IN_LOOP | set(GROWS_IN_TOOL_LOOP_EXCEPT) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_plain_chat_and_a_system_prompt(name):
    plain = render(name, [USER])
    assert "Weather in Paris?" in plain
    with_system = render(name, [{"role": "system", "content": "Answer in French."}, USER])
    assert "Answer in French." in with_system and "Weather in Paris?" in with_system


@pytest.mark.parametrize("name", NAMES)
def test_the_tools_offered(name):
    text = render(name, [USER], TOOLS)
    shown = "get_weather" in text and "The weather in a city" in text
    assert shown == (name not in NO_TOOLS), text[-1500:]


@pytest.mark.parametrize("name", NAMES)
def test_a_tool_call_and_its_result(name):
    if name in REFUSES_TOOL_TURN:
        with pytest.raises(TemplateError, match=REFUSES_TOOL_TURN[name]) as refused:
            render(name, [USER, CALL, RESULT], TOOLS)
        assert isinstance(refused.value, UsageError) and refused.value.reason.startswith(REFUSES_TOOL_TURN[name])
        return
    text = render(name, [USER, CALL, RESULT], TOOLS)
    assert ("clear" in text) == (name not in NO_TOOL_RESULTS)
    assert ("Paris" in text.split("Weather in Paris?", 1)[-1]) == (name not in NO_CALLS), text[-1500:]


@pytest.mark.parametrize("name", NAMES)
def test_earlier_reasoning_is_written_where_the_template_writes_it(name):
    in_loop = [USER, {**CALL, "reasoning_content": REASONING}, RESULT]
    in_history = [USER, {"role": "assistant", "content": "It is sunny.", "reasoning_content": REASONING},
                  {"role": "user", "content": "Thanks"}]
    if name in REFUSES_TOOL_TURN:
        with pytest.raises(TemplateError):
            render(name, in_loop, TOOLS)
    else:
        assert (REASONING in render(name, in_loop, TOOLS)) == (name in REASONING_IN_LOOP)
    assert (REASONING in render(name, in_history)) == (name in REASONING_IN_HISTORY)


def grows(name: str, turns: list[list[dict]], tools=None) -> bool:
    """Each turn's prompt starts with the one before it without its generation prompt (what the template writes
    with one and without in common, as llama.cpp finds the generation prompt: Phi-3.5 ends a prompt without one
    with an end-of-text)."""
    for before, after in zip(turns, turns[1:]):
        prompt = os.path.commonprefix([render(name, before, tools), render(name, before, tools, add_generation_prompt=False)])
        if not render(name, after, tools).startswith(prompt):
            return False
    return True


@pytest.mark.parametrize("name", NAMES)
def test_a_system_message_in_the_middle_keeps_the_prompt_growing_at_its_end(name):
    """As Claude Code sends them: a reminder after the user's message, another before the next one."""
    start = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
             {"role": "system", "content": "Reminder-4W: today is Monday."}]
    middle = [*start, {"role": "assistant", "content": "Hello!"}, {"role": "system", "content": "Reminder-5X: be kind."},
              {"role": "user", "content": "Weather?"}]
    later = [*middle, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    text = render(name, later)
    assert "Reminder-4W: today is Monday." in text and "Reminder-5X: be kind." in text
    assert text.index("Hi there") < text.index("Reminder-4W") < text.index("Hello!") < text.index("Reminder-5X") < text.index("Weather?")
    assert grows(name, [start, middle, later]) == (name not in GROWS_EXCEPT)


@pytest.mark.parametrize("name", NAMES)
def test_a_tool_loop_keeps_the_prompt_growing_at_its_end(name):
    start = [{"role": "system", "content": "You are terse."}, USER]
    loop = [*start, {**CALL, "reasoning_content": REASONING}, RESULT]
    later = [*loop, {"role": "assistant", "content": "Clear.", "reasoning_content": "it is clear"},
             {"role": "user", "content": "Thanks"}]
    try:
        grown = grows(name, [start, loop, later], TOOLS)
    except TemplateError:
        grown = False
    assert grown == (name not in GROWS_IN_TOOL_LOOP_EXCEPT)


def test_a_later_system_message_goes_to_the_next_user_message_where_the_template_has_no_place_for_it(capsys):
    name = "deepseek-ai-DeepSeek-V3.1"  # writes every system message at the top
    assert not template_caps(template(name)).system_in_place
    text = render(name, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}, {"role": "system", "content": "Be kind."},
                         {"role": "user", "content": "Weather?"}])
    assert text.startswith("<s>You are terse.<｜User｜>Hi") and "<｜User｜>Be kind.\nWeather?" in text
    after_user = render(name, [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be kind."}])
    assert after_user.endswith("<｜User｜>Hi\nBe kind.<｜Assistant｜><think>")  # the end of the user's message it follows
    said = capsys.readouterr().err
    assert said.count("notice: ") <= 1  # once per template and process (another test may have said it already)
    assert "notice: " not in capsys.readouterr().err
    # a template without a system role (Gemma 2): the first one too, as llama.cpp merges it
    gemma = render("google-gemma-2-2b-it", [{"role": "system", "content": "Answer in French."}, USER])
    assert "<start_of_turn>user\nAnswer in French.\nWeather in Paris?<end_of_turn>" in gemma


def test_tool_call_ids_as_mistral_demands_them_still_match_their_results():
    text = render("mistralai-Mistral-Nemo-Instruct-2407", [USER, CALL, RESULT], TOOLS)
    ids = re.findall(r'"id": "([^"]*)"', text) + re.findall(r'"call_id": "([^"]*)"', text)
    assert len(ids) == 2 and ids[0] == ids[1] == _short_id(CALL_ID)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", ids[0]) and CALL_ID not in text
    assert _short_id("abcDEF123") == "abcDEF123" and _short_id("call_1") != _short_id("call_2")
    # a call and a result that name no id: one from their place, the same for both
    unnamed = [USER, {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": None}]}, {**RESULT, "tool_call_id": None}]
    text = render("mistralai-Mistral-Nemo-Instruct-2407", unnamed, TOOLS)
    ids = re.findall(r'"id": "([^"]*)"', text) + re.findall(r'"call_id": "([^"]*)"', text)
    assert len(ids) == 2 and ids[0] == ids[1] and re.fullmatch(r"[A-Za-z0-9]{9}", ids[0])


def test_arguments_as_the_template_reads_them():
    caps = template_caps(template("meetkai-functionary-medium-v3.2"))
    assert caps.tool_calls and not caps.object_arguments  # it writes them as a string
    assert '>>>get_weather\n{"city": "Paris"}' in render("meetkai-functionary-medium-v3.2", [USER, CALL, RESULT], TOOLS)
    as_text = {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    qwen = render("Qwen-Qwen2.5-7B-Instruct", [USER, as_text, RESULT], TOOLS)  # a string, parsed for an object reader
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in qwen
    broken = {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "get_weather", "arguments": '{"city": '}}]}
    with pytest.raises(TemplateError, match="not JSON"):
        render("Qwen-Qwen2.5-7B-Instruct", [USER, broken, RESULT], TOOLS)


def test_the_environment_is_llama_cpps():
    # {% break %} (Command R7B: `localrun create` refused it), a list appended to (Kimi K2's id queue)
    assert "{%- break %}" in template("CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    compile_template(template("CohereForAI-c4ai-command-r7b-12-2024-tool_use"))
    assert "functions.get_weather:0" in render("Kimi-K2-Instruct", [USER, CALL, RESULT], TOOLS)
    # what stays refused in the sandbox
    assert render_template("{{ messages.__class__ }}{{ namespace.__init__.__globals__ }}", [USER]) == ""
    with pytest.raises(TemplateError, match="unsafe"):
        render_template("{{ ''.__class__.__mro__[1].__subclasses__() }}", [USER])
    messages = [dict(USER)]
    assert render_template("{% set m = messages.pop() %}{{ m.content }}", messages) == "Weather in Paris?"
    assert messages == [USER]  # a template changes its own copies, never the caller's messages
    # the variables llama.cpp passes: today's date, enable_thinking (on by default), chat_template_kwargs
    from datetime import datetime

    llama = render("meta-llama-Llama-3.1-8B-Instruct", [USER])
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in llama
    assert render("Qwen-Qwen3-0.6B", [USER]).endswith("<|im_start|>assistant\n")
    assert render("Qwen-Qwen3-0.6B", [USER], enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    assert render("deepseek-ai-DeepSeek-V3.1", [USER]).endswith("<｜Assistant｜><think>")  # thinking, as llama-server
    assert "Reasoning: high" in render("openai-gpt-oss-120b", [USER], reasoning_effort="high")
    # developer is system, except for gpt-oss, whose template has a developer role
    assert "Be brief." in render("Qwen-Qwen2.5-7B-Instruct", [{"role": "developer", "content": "Be brief."}, USER])
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in render(
        "openai-gpt-oss-120b", [{"role": "developer", "content": "Be brief."}, USER])


def test_a_refusal_and_a_broken_template_are_one_line_errors():
    with pytest.raises(TemplateError) as refused:
        render_template("{{ raise_exception('Only user and assistant roles are supported!') }}", [USER])
    assert refused.value.reason == "Only user and assistant roles are supported!" and not refused.value.compiling
    assert refused.value.message == "the model's chat template refuses these messages: Only user and assistant roles are supported!"
    with pytest.raises(TemplateError) as failed:
        render_template("{% for m in messages %}\n{{ m.content + 1 }}{% endfor %}", [USER])
    assert failed.value.line == 2 and "TypeError" in failed.value.reason and "\n" not in failed.value.message
    with pytest.raises(TemplateError) as broken:
        compile_template("{% for m in messages %}\n{{ m.content }\n")
    assert broken.value.compiling and broken.value.line == 2 and "\n" not in broken.value.message
    assert broken.value.message.startswith("the chat template is not valid Jinja (line 2: ")
