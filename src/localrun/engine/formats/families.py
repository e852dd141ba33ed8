"""The table of families: what in a chat template tells its family (in llama.cpp's order of choice:
common/chat.cpp common_chat_try_specialized_template, then the shapes its auto-parser finds), the markers
its models think between, how they write tool calls, and what wraps their answer.

A new model of a known shape works without a code change: a family is chosen by the markers its template
writes, not by the model's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Optional

from .thinking import GPT_OSS, Markers
from . import special
from .syntax import WS, Cap, JsonCalls, NameArgs, Opt, Syntax, Tagged, held


@dataclass(frozen=True)
class Family:
    name: str
    thinking: Optional[Markers] = None
    calls: Optional[Syntax] = None
    # text around the answer, dropped (Granite's <response>, Command R7B's <|START_RESPONSE|>)
    wraps: tuple[str, ...] = ()
    # special tokens the output must show (llama.cpp's preserved_tokens): its markers, printed as text
    preserved: tuple[str, ...] = field(default=())
    # text dropped where the thinking is read apart (gpt-oss's message ends: its thinking left inline keeps them)
    wraps_reasoned: tuple[str, ...] = ()
    # text dropped only at the answer's end (Gemma 4's stray "<channel|>")
    tails: tuple[str, ...] = ()
    # the prompt's tail is part of the content when thinking is left inline (llama.cpp's Qwen3-Coder parser reads its
    # generation prompt's "<think>" so; the others read their generation prompt as the turn's header)
    tail_content: bool = False
    # where the thinking begins in a template's generation prompt, for a family whose thinking has no open marker
    # (Apriel's "Here are my reasoning steps:" is the thinking's own first words)
    header_cut: str = ""
    # where a turn of another role begins, for a family whose assistant header recurs within one turn (gpt-oss
    # writes "<|start|>assistant" before each message): the turn is the first header after it
    turn: str = ""

    def unwrap(self, answer: str, partial: bool, reasoning: str = "auto") -> str:
        for w in (*self.wraps, *(self.wraps_reasoned if reasoning != "none" else ())):
            answer = answer.replace(w, "")
        for t in self.tails:
            stripped = answer.rstrip()
            if stripped.endswith(t):
                answer = stripped[:-len(t)]
        if partial and (self.wraps or self.tails):
            answer = answer[:len(answer) - held(answer, (*self.wraps, *self.tails))]
        return answer


def _think(ends: tuple = (), open_: str = "<think>", close: str = "</think>") -> Markers:
    return Markers(open_, close, ends=ends)


HERMES = JsonCalls("<tool_call>", "</tool_call>")

# The row is chosen by its test on the template's text; the first that passes wins.
_ROWS: list[tuple[str, Callable[[str], bool], Callable[[str], Family]]] = []


def _row(name: str, test: Callable[[str], bool]):
    def add(make: Callable[[str], Family]):
        _ROWS.append((name, test, make))
        return make
    return add


def _has(*markers: str) -> Callable[[str], bool]:
    return lambda t: all(m in t for m in markers)


def _reasoning(t: str, ends: tuple = ()) -> Optional[Markers]:
    return _think(ends) if "<think>" in t or "</think>" in t else None


@_row("ministral-3", lambda t: all(m in t for m in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) and "[CALL_ID]" not in t)
def _ministral(t):
    return Family("ministral-3", Markers("[THINK]", "[/THINK]") if "[THINK]" in t else None,
                  NameArgs(("[TOOL_CALLS]", Cap("name", ("[ARGS]",)), "[ARGS]")))


@_row("gpt-oss", _has("<|channel|>"))
def _gpt_oss(t):
    thinking = Markers(GPT_OSS.open, GPT_OSS.close, GPT_OSS.answer_prefix,
                       strays=("<|channel|>commentary to=assistant", "<|start|>assistant<|channel|>commentary to=assistant"))
    return Family("gpt-oss", thinking, special.Harmony(), turn=r"<\|start\|>(?!assistant)",
                  wraps=("<|start|>assistant<|channel|>commentary to=assistant", "<|channel|>commentary to=assistant",
                         "<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>",
                         "<|start|>assistant<|channel|>final <|constrain|>json<|message|>", "<|channel|>final <|constrain|>json<|message|>",
                         "<|return|>"),
                  wraps_reasoned=("<|end|>",),
                  preserved=("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"))


@_row("functionary-v3.2", _has(">>>all", ">>>${recipient}"))
def _functionary_32(t):
    return Family("functionary-v3.2", None, special.FunctionaryV32())


@_row("kimi-k2", _has("<|tool_calls_section_begin|>", "<|tool_call_begin|>"))
def _kimi(t):
    calls = NameArgs(("<|tool_call_begin|>", WS, Cap("id", ("<|tool_call_argument_begin|>",), r"[^<\s]"), WS, "<|tool_call_argument_begin|>"),
                     call_close="<|tool_call_end|>", section_open="<|tool_calls_section_begin|>",
                     section_close="<|tool_calls_section_end|>", name_from_id=r"(?:functions\.)?(.+?)(?::\d+)?",
                     section_optional=True)
    return Family("kimi-k2", _think(("<|tool_calls_section_begin|>", "<|tool_call_begin|>")), calls)


@_row("kimi-k3", _has("<|open|>", "<|close|>", "<|end_of_msg|>"))
def _kimi_k3(t):
    calls = Tagged(('<|open|>call tool="', Cap("name", ('"',)), '"', Cap("index", ("<|sep|>",), r'[^<>]'), "<|sep|>"),
                   ('<|open|>argument key="', Cap("key", ('"',)), '"', WS, 'type="', Cap("type", ('"',), r"[a-z]"), '"<|sep|>'),
                   "<|close|>argument<|sep|>", "<|close|>call<|sep|>", section_open="<|open|>tools<|sep|>",
                   section_close="<|close|>tools<|sep|>")
    return Family("kimi-k3", Markers("<|open|>think<|sep|>", "<|close|>think<|sep|>", ends=("<|open|>response<|sep|>", "<|open|>tools<|sep|>")),
                  calls, wraps=("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"))


@_row("ling-3", _has("<role>ASSISTANT</role>", "<arg_key>"))
def _ling3(t):
    return Family("ling-3", _reasoning(t, ("<tool_call>",)), _glm_calls(), wraps=("<|role_end|>",))


@_row("muse-glimmer", _has("<atem:function_calls>", "<|eom|>"))
def _muse(t):
    return Family("muse-glimmer", None, special.Recipients())


@_row("cohere2moe", _has("<|START_TEXT|>", "<|START_ACTION|>"))
def _cohere2(t):
    return Family("cohere2moe", Markers("<|START_THINKING|>", "<|END_THINKING|>"), _COMMAND_ACTION,
                  wraps=("<|START_TEXT|>", "<|END_TEXT|>"), tail_content=True)


@_row("lfm2", lambda t: "<|tool_list_start|>" in t or ("List of tools: [" in t and "<|tool_list_start|>" not in t))
def _lfm2(t):
    return Family("lfm2", _reasoning(t), special.Pythonic("<|tool_call_start|>", "<|tool_call_end|>"))


@_row("gigachat-v3", lambda t: "<|role_sep|>" in t and "<|message_sep|>" in t and "<|function_call|>" not in t)
def _gigachat(t):
    return Family("gigachat-v3", None, JsonCalls("<|message_sep|>\n\nfunction call<|role_sep|>"))


@_row("minimax-m3", _has("]<]minimax[>[", "<tool_call>", "<invoke name="))
def _minimax_m3(t):
    ns = "]<]minimax[>["
    calls = Tagged((ns + '<invoke name="', Cap("name", ('"',)), '">'), (ns + "<", Cap("key", (">",)), ">"),
                   ns + "</{key}>", ns + "</invoke>", section_open=ns + "<tool_call>", section_close=ns + "</tool_call>", nested=ns)
    return Family("minimax-m3", Markers("<mm:think>", "</mm:think>", ends=(ns + "<tool_call>",)), calls)


@_row("deepseek-v3.2", lambda t: "dsml_token" in t and "DSML" in t and ("function_calls" in t or "tool_calls" in t))
def _dsml(t):
    d = "｜DSML｜"
    block = "tool_calls" if f"{{{{dsml_token}}}}tool_calls" in t or "tool_calls>" in t and "function_calls>" not in t else "function_calls"
    calls = Tagged((f"<{d}invoke name=\"", Cap("name", ('"',)), '">'),
                   (f"<{d}parameter name=\"", Cap("key", ('"',)), '"', WS, Opt('string="'), Cap("string", ('"',), r"[a-z]"), '">'),
                   f"</{d}parameter>", f"</{d}invoke>", section_open=f"<{d}{block}>", section_close=f"</{d}{block}>")
    return Family("deepseek-v3.2", _think((f"<{d}{block}>",)), calls)


@_row("gemma4", _has("'<|tool_call>call:'"))
def _gemma4(t):
    return Family("gemma4", Markers("<|channel>thought", "<channel|>", strays=("<|channel>",)), special.Gemma4(),
                  wraps=("<|channel>thought\n<channel|>", "<|channel>thought<channel|>"), tails=("<channel|>",),
                  preserved=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>'))


@_row("minicpm5", _has("Tool usage guidelines:", '<function name="', '<param name="'))
def _minicpm5(t):
    calls = Tagged(('<function name="', Cap("name", ('"',)), '">'), ('<param name="', Cap("key", ('"',)), '">'),
                   "</param>", "</function>", cdata=True)
    return Family("minicpm5", _reasoning(t), calls)


@_row("qwen3-coder", lambda t: all(m in t for m in ("<tool_call>", "<function=", "<parameter=")))
def _qwen3_coder(t):
    calls = Tagged(("<function=", Cap("name", (">",)), ">"), ("<parameter=", Cap("key", (">",)), ">"), "</parameter>",
                   "</function>", section_open="<tool_call>", section_close="</tool_call>", trim_newline=True,
                   section_optional="<think>" not in t)  # Qwen3-Coder may leave <tool_call> out (llama.cpp's workaround)
    return Family("qwen3-coder", _reasoning(t, ("<tool_call>",)), calls, tail_content=True)


# -- the shapes llama.cpp's auto-parser finds, by their markers ------------------------------------------------------


@_row("seed-oss", _has("<seed:tool_call>"))
def _seed(t):
    calls = Tagged(("<function=", Cap("name", (">",)), ">"), ("<parameter=", Cap("key", (">",)), ">"), "</parameter>",
                   "</function>", section_open="<seed:tool_call>", section_close="</seed:tool_call>")
    return Family("seed-oss", Markers("<seed:think>", "</seed:think>"), calls)


def _glm_calls() -> Tagged:
    return Tagged(("<tool_call>", Cap("name", ("\n", "<arg_key>", "</tool_call>"), r"[^<>\n]")),
                  ("<arg_key>", Cap("key", ("</arg_key>",), r"[^<>]"), "</arg_key>", WS, "<arg_value>"), "</arg_value>", "</tool_call>")


@_row("glm-4", _has("<arg_key>", "<arg_value>"))
def _glm(t):
    return Family("glm-4", _reasoning(t, ("<tool_call>",)), _glm_calls())


@_row("minimax-m2", _has("<minimax:tool_call>"))
def _minimax_m2(t):
    calls = Tagged(('<invoke name="', Cap("name", ('"',)), '">'), ('<parameter name="', Cap("key", ('"',)), '">'), "</parameter>",
                   "</invoke>", section_open="<minimax:tool_call>", section_close="</minimax:tool_call>")
    return Family("minimax-m2", _reasoning(t, ("<minimax:tool_call>",)), calls)


@_row("deepseek-r1", lambda t: "<｜tool▁calls▁begin｜>" in t and "```json" in t)
def _deepseek_r1(t):
    calls = NameArgs(("<｜tool▁call▁begin｜>", Opt("function"), "<｜tool▁sep｜>", Cap("name", ("\n",), r"[^\n<]"), "\n"),
                     call_close="<｜tool▁call▁end｜>", section_open="<｜tool▁calls▁begin｜>", section_close="<｜tool▁calls▁end｜>",
                     fenced=True)
    return Family("deepseek-r1", _think(("<｜tool▁calls▁begin｜>",)), calls)


@_row("deepseek-v3.1", _has("<｜tool▁calls▁begin｜>"))
def _deepseek_v31(t):
    calls = NameArgs(("<｜tool▁call▁begin｜>", Cap("name", ("<｜tool▁sep｜>",), r"[^<\n｜]"), "<｜tool▁sep｜>"),
                     call_close="<｜tool▁call▁end｜>", section_open="<｜tool▁calls▁begin｜>", section_close="<｜tool▁calls▁end｜>")
    return Family("deepseek-v3.1", _think(("<｜tool▁calls▁begin｜>",)), calls)


_COMMAND_ACTION = JsonCalls("<|START_ACTION|>", "<|END_ACTION|>", name_keys=("tool_name", "name"),
                            args_keys=("parameters", "arguments"), id_keys=("tool_call_id", "id"))


@_row("command-r7b", _has("<|START_ACTION|>"))
def _command_r7b(t):
    return Family("command-r7b", Markers("<|START_THINKING|>", "<|END_THINKING|>"), _COMMAND_ACTION,
                  wraps=("<|START_RESPONSE|>", "<|END_RESPONSE|>"))


@_row("command-r-plus", lambda t: "Action:" in t and "```json" in t and "tool_name" in t)
def _command_r_plus(t):
    return Family("command-r-plus", None, JsonCalls("Action:", name_keys=("tool_name", "name"), args_keys=("parameters", "arguments")),
                  wraps=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"))


@_row("apertus", _has("<|tools_prefix|>"))
def _apertus(t):
    return Family("apertus", Markers("<|inner_prefix|>", "<|inner_suffix|>"),
                  JsonCalls("<|tools_prefix|>", "<|tools_suffix|>", name_as_key=True, list_only=True))


@_row("nemotron-v2", _has("<TOOLCALL>"))
def _nemotron(t):
    return Family("nemotron-v2", _reasoning(t, ("<TOOLCALL>",)), JsonCalls("<TOOLCALL>", "</TOOLCALL>"))


@_row("apriel", _has("<tool_calls>"))
def _apriel(t):
    thinking = Markers("", "[BEGIN FINAL RESPONSE]") if "[BEGIN FINAL RESPONSE]" in t else None  # thinks from the turn's start
    return Family("apriel", thinking, JsonCalls("<tool_calls>", "</tool_calls>"), wraps=("[END FINAL RESPONSE]", "<|end|>"),
                  header_cut="Here are my reasoning steps:")


@_row("granite-3", _has("<|tool_call|>"))
def _granite3(t):
    return Family("granite-3", _reasoning(t), JsonCalls("<|tool_call|>"), wraps=("<response>", "</response>"))


@_row("gigachat-v3.1", _has("<|function_call|>"))
def _gigachat31(t):
    return Family("gigachat-v3.1", None, JsonCalls("<|function_call|>"))


@_row("mistral-call-id", _has("[TOOL_CALLS]", "[CALL_ID]"))
def _mistral_call_id(t):
    return Family("mistral", _reasoning(t), NameArgs(("[TOOL_CALLS]", Cap("name", ("[CALL_ID]",)), "[CALL_ID]",
                                                     Cap("id", ("[ARGS]",)), "[ARGS]")))


@_row("mistral-args", _has("[TOOL_CALLS]", "[ARGS]"))
def _mistral_args(t):
    return Family("mistral", Markers("[THINK]", "[/THINK]") if "[THINK]" in t else None,
                  NameArgs(("[TOOL_CALLS]", Cap("name", ("[ARGS]",)), "[ARGS]")))


@_row("mistral", _has("[TOOL_CALLS]"))
def _mistral(t):
    return Family("mistral", None, JsonCalls("[TOOL_CALLS]"))


@_row("functionary-v3.1", lambda t: "<function=" in t and "<parameter=" not in t)
def _functionary_31(t):
    return Family("functionary-v3.1", None, NameArgs(("<function=", Cap("name", (">",)), ">"), call_close="</function>"))


@_row("firefunction-v2", _has("functools["))
def _firefunction(t):
    return Family("firefunction-v2", None, JsonCalls(" functools", list_only=True))


@_row("hermes", _has("<tool_call>"))
def _hermes(t):
    return Family("hermes", _reasoning(t), HERMES)


@_row("llama-3", lambda t: "<|python_tag|>" in t or "ipython" in t)
def _llama3(t):
    return Family("llama-3", None, None)  # bare JSON calls and <|python_tag|>: the lenient reader reads them


PLAIN = Family("plain")


@lru_cache(maxsize=32)
def detect(template: str) -> Family:
    for _name, test, make in _ROWS:
        if test(template):
            family = make(template)
            return _with_preserved(family)
    thinking = _reasoning(template)
    return Family("plain", thinking) if thinking else PLAIN


_LITERAL = re.compile(r"<[|｜][^<>]*?[|｜]>|\[[A-Z_]+\]|<\|?[a-z_:/]+\|?>")


def _with_preserved(family: Family) -> Family:
    """The family with every marker it writes among the special tokens its output shows."""
    from dataclasses import replace

    texts: set[str] = set(family.preserved)
    for marker in _texts(family.thinking) | _texts(family.calls) | set(family.wraps):
        texts.update(_LITERAL.findall(marker))
    return replace(family, preserved=tuple(sorted(texts)))


def _texts(obj) -> set[str]:
    """The literal texts of markers, a syntax's fields and its sequences."""
    if obj is None:
        return set()
    out: set[str] = set()
    values = obj.__dict__.values() if hasattr(obj, "__dict__") else ()
    for v in values:
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, tuple):
            for item in v:
                if isinstance(item, str):
                    out.add(item)
                elif isinstance(item, Opt):
                    out.add(item.text)
    return out
