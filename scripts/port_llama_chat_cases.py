#!/usr/bin/env python3
"""Port llama.cpp's chat parser cases (tests/test-chat.cpp) into tests/data/llama_chat_cases.json: what models of
each family write, and what must be read from it (content, reasoning, tool calls), case by case.

    python scripts/port_llama_chat_cases.py PATH/TO/llama.cpp/tests/test-chat.cpp --llama BUILD [--out FILE]

The source is the test-chat.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors (its `vendor/llama.cpp`);
the C++ file is not in this repository, the JSON it gives is (tests/engine/test_llama_chat_cases.py reads it).

How: the C++ is read by a small interpreter of the subset the test file is written in (string literals decoded
byte for byte: concatenation, escapes, raw strings, UTF-8; blocks, declarations, range-for loops, calls of its
helpers and of its own test functions), so every `peg_tester(...)` / `tst.test(INPUT)....run()` chain becomes one
record, with llama.cpp's defaults filled in (common_chat_templates_inputs: reasoning_format none,
enable_thinking true, parallel_tool_calls false, tool_choice auto, add_generation_prompt true) and every predefined
tool and message resolved. A statement it cannot execute is named on stderr by line with why, and recorded under
"not_ported" (the test shows each as a skipped test): nothing is dropped silently. It checks that every `.run()` of
the source was executed or lies in a reported region, and that each peg_tester gave as many cases as its chains
times the loops around it. Counts per template go to stderr.

Then every case is run through llama.cpp itself (--llama: a small C++ program, HARNESS below, built against that
llama.cpp's static libraries) as test_peg_parser runs it: the whole parse, every prefix with compute_diffs
accumulated, the reconstruction where the case asks for it. Any disagreement with the case's expectation is an
error (nothing is written), so the data holds exactly what llama.cpp's test holds; the run also records each case's
generation prompt (the prefilled turn of a continue_final_message case, which the test needs).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "llama_chat_cases.json"
TEMPLATES = ROOT / "tests" / "data" / "templates"
BUILD_HELP = """\
A static build of the same llama.cpp, for --llama (a few minutes; the libraries are all it needs):

    cmake -S vendor/llama.cpp -B /tmp/llama-build -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF
    cmake --build /tmp/llama-build --target llama-common -j
"""
ENTRY = "test_template_output_peg_parsers"  # the function holding every peg_tester case (it calls test_lfm2_parser)

# Test functions that main() runs besides ENTRY: none of them parses a model's output against a template.
# (test_msg_diffs_compute, compute_diffs between two messages, is ported by hand: test_deltas_* in the test file.)
OTHER_FUNCTIONS = {
    "test_msgs_oaicompat_json_conversion": "llama.cpp's own message <-> OpenAI JSON conversion",
    "test_msg_token_delimiters_split": "llama.cpp's token-level split of a conversation into messages",
    "test_tools_oaicompat_json_conversion": "llama.cpp's own tool <-> OpenAI JSON conversion",
    "test_convert_responses_to_chatcmpl": "the server's Responses API to chat-completions conversion",
    "test_developer_role_to_system_workaround": "prompt rendering (developer role mapped to system)",
    "test_deepseek_v4_thinking_retention": "prompt rendering (which past reasoning DeepSeek V4's prompt keeps)",
    "test_deepseek_v4_tool_result_ordering": "prompt rendering (tool results' order in DeepSeek V4's prompt)",
    "test_template_generation_prompt": "the generation prompt strings (continuation prefills included): prompt "
                                       "rendering, not a model output",
    "test_reasoning_effort_caps": "reasoning-effort parameters, not a model output",
    "test_reasoning_budget_tokens_per_request": "reasoning-budget sampler parameters, not a model output",
    "test_reasoning_budget_message_per_request": "reasoning-budget sampler parameters, not a model output",
}

# The other two chat test files: what they test, and why nothing of them is ported.
OTHER_FILES = {
    "tests/test-chat-auto-parser.cpp": "the auto-parser's analysis of templates (marker detection, diff splits, "
                                       "role markers) and parsers built with the PEG builder API: llama.cpp-internal, "
                                       "no model output is parsed against a real template",
    "tests/test-chat-peg-parser.cpp": "the PEG parser and builder API on hand-built grammars (no real template)",
}

# Why a region of ENTRY was not ported, by what it calls (first match wins).
REGION_REASONS = [
    ("out_of_range", "checks which C++ exception llama.cpp's parse-error path throws (out_of_range vs "
                     "runtime_error), and runs only under --template: llama.cpp-internal"),
    ("common_chat_templates_apply", "checks the rendered prompt (common_chat_templates_apply), not what a model "
                                    "wrote: the prompt renderer's concern"),
]

REASONING_FORMATS = {
    "COMMON_REASONING_FORMAT_NONE": "none",
    "COMMON_REASONING_FORMAT_AUTO": "auto",
    "COMMON_REASONING_FORMAT_DEEPSEEK": "deepseek",
    "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": "deepseek_legacy",
}
TOOL_CHOICES = {
    "COMMON_CHAT_TOOL_CHOICE_AUTO": "auto",
    "COMMON_CHAT_TOOL_CHOICE_REQUIRED": "required",
    "COMMON_CHAT_TOOL_CHOICE_NONE": "none",
}
CONTINUATIONS = {
    "COMMON_CHAT_CONTINUATION_NONE": None,
    "COMMON_CHAT_CONTINUATION_AUTO": "auto",
    "COMMON_CHAT_CONTINUATION_REASONING": "reasoning",
    "COMMON_CHAT_CONTINUATION_CONTENT": "content",
}


class Unported(Exception):
    """A construct the interpreter does not execute (the statement holding it is reported)."""


# ---------------------------------------------------------------------------------------------------- tokens

@dataclass
class Tok:
    kind: str  # "str", "chr", "num", "id", "op"
    value: Any  # str literal: bytes; others: text
    line: int
    pos: int  # index in the token list


SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "\\": 92, '"': 34, "'": 39, "?": 63, "a": 7, "b": 8, "f": 12,
                  "v": 11}
STRING_PREFIXES = ("u8R", "uR", "UR", "LR", "R", "u8", "u", "U", "L")
OPERATORS = ["::", "->", "<<", ">>", "&&", "||", "==", "!=", "<=", ">=", "+=", "-=", "++", "--"]


def decode_escapes(body: str, line: int) -> bytes:
    """A narrow C++ string literal's body as the bytes it denotes (the source is UTF-8)."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        n = body[i + 1]
        if n in SIMPLE_ESCAPES:
            out.append(SIMPLE_ESCAPES[n])
            i += 2
        elif n in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            out.append(int(m.group(), 8))
            i += 1 + len(m.group())
        elif n == "x":
            m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
            if not m or int(m.group(), 16) > 0xFF:
                raise SyntaxError(f"line {line}: bad \\x escape")
            out.append(int(m.group(), 16))
            i += 2 + len(m.group())
        elif n in "uU":
            width = 4 if n == "u" else 8
            out += chr(int(body[i + 2:i + 2 + width], 16)).encode("utf-8")
            i += 2 + width
        else:
            raise SyntaxError(f"line {line}: unknown escape \\{n}")
    return bytes(out)


def tokenize(src: str) -> tuple[list[Tok], dict[int, str]]:
    """C++ tokens (comments and preprocessor lines dropped) and the `//` comments by line (for case names)."""
    toks: list[Tok] = []
    comments: dict[int, str] = {}
    i, line, n = 0, 1, len(src)
    at_line_start = True

    def add(kind, value, ln):
        toks.append(Tok(kind, value, ln, len(toks)))

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and at_line_start:
            while i < n and src[i] != "\n":
                if src[i] == "\\" and i + 1 < n and src[i + 1] == "\n":
                    line += 1
                    i += 1
                i += 1
            continue
        at_line_start = False
        if src.startswith("//", i):
            end = src.find("\n", i)
            end = n if end < 0 else end
            comments[line] = src[i + 2:end].strip()
            i = end
            continue
        if src.startswith("/*", i):
            end = src.index("*/", i + 2)
            line += src.count("\n", i, end)
            i = end + 2
            continue
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", src[i:i + 200])
        if m:
            word = m.group()
            if word in STRING_PREFIXES and src.startswith('"', i + len(word)):
                i += len(word)
                start_line = line
                if word.endswith("R"):  # raw string: R"delim( ... )delim"
                    open_paren = src.index("(", i)
                    delim = src[i + 1:open_paren]
                    close = src.index(")" + delim + '"', open_paren)
                    body = src[open_paren + 1:close]
                    line += body.count("\n")
                    add("str", body.encode("utf-8"), start_line)
                    i = close + len(delim) + 2
                else:
                    i = scan_quoted(src, i, '"', lambda body: add("str", decode_escapes(body, start_line), start_line))
                continue
            add("id", word, line)
            i += len(word)
            continue
        if c == '"':
            start_line = line
            i = scan_quoted(src, i, '"', lambda body: add("str", decode_escapes(body, start_line), start_line))
            continue
        if c == "'":
            start_line = line
            i = scan_quoted(src, i, "'", lambda body: add("chr", decode_escapes(body, start_line), start_line))
            continue
        m = re.match(r"\d[0-9a-zA-Z_.']*", src[i:i + 64])
        if m:
            add("num", m.group(), line)
            i += len(m.group())
            continue
        for op in OPERATORS:
            if src.startswith(op, i):
                add("op", op, line)
                i += len(op)
                break
        else:
            add("op", c, line)
            i += 1
    return toks, comments


def scan_quoted(src: str, i: int, quote: str, emit) -> int:
    j = i + 1
    while src[j] != quote:
        if src[j] == "\\":
            j += 1
        if src[j] == "\n":
            raise SyntaxError("newline in a string literal")
        j += 1
    emit(src[i + 1:j])
    return j + 1


def matching(toks: list[Tok], i: int) -> int:
    """The index of the bracket closing the one at toks[i]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[toks[i].value]]
    j = i + 1
    while stack:
        t = toks[j]
        if t.kind == "op":
            if t.value in pairs:
                stack.append(pairs[t.value])
            elif t.value in (")", "}", "]"):
                if t.value != stack.pop():
                    raise SyntaxError(f"line {t.line}: unbalanced {t.value}")
        j += 1
    return j - 1


def until_semicolon(toks: list[Tok], i: int) -> int:
    """The index of the `;` ending the statement that starts at i (brackets skipped)."""
    while not (toks[i].kind == "op" and toks[i].value == ";"):
        if toks[i].kind == "op" and toks[i].value in "({[":
            i = matching(toks, i)
        i += 1
    return i


def is_op(t: Tok, value: str) -> bool:
    return t.kind == "op" and t.value == value


# ---------------------------------------------------------------------------------------------------- values

@dataclass
class Tool:
    name: str = ""
    description: str = ""
    parameters: str = ""


@dataclass
class Call:
    name: str = ""
    arguments: str = ""
    id: str = ""


@dataclass
class Msg:
    role: str = ""
    content: str = ""
    content_parts: list = field(default_factory=list)  # [(type, text)]
    tool_calls: list = field(default_factory=list)  # [Call]
    reasoning_content: str = ""
    tool_name: str = ""
    tool_call_id: str = ""


MSG_FIELDS = ["role", "content", "content_parts", "tool_calls", "reasoning_content", "tool_name", "tool_call_id"]


@dataclass
class Tester:
    template: str  # the file name, as in tests/data/templates/
    site: int = 0  # the token position of its peg_tester(...) call


@dataclass
class Builder:
    tester: Tester
    line: int
    case: dict


@dataclass
class Function:
    name: str
    params: list[str]
    body: tuple[int, int]  # token range of the body's braces
    line: int


class Opaque:
    """A value of a type the interpreter does not model (using it is Unported)."""

    def __init__(self, typename: str):
        self.typename = typename


def as_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise Unported(f"expected a string, got {type(v).__name__}")


def as_tool(v: Any) -> Tool:
    if isinstance(v, Tool):
        return v
    if isinstance(v, list) and len(v) == 3:
        return Tool(*(as_str(x) for x in v))
    raise Unported(f"expected a common_chat_tool, got {v!r:.60}")


def as_call(v: Any) -> Call:
    if isinstance(v, Call):
        return v
    if isinstance(v, list) and 1 <= len(v) <= 3:
        parts = [("" if x == [] else as_str(x)) for x in v]
        return Call(*parts)
    raise Unported(f"expected a common_chat_tool_call, got {v!r:.60}")


def as_msg(v: Any) -> Msg:
    if isinstance(v, Msg):
        return copy.deepcopy(v)
    if isinstance(v, list) and len(v) <= len(MSG_FIELDS):
        msg = Msg()
        for name, x in zip(MSG_FIELDS, v):
            set_msg_field(msg, name, x)
        return msg
    raise Unported(f"expected a common_chat_msg, got {v!r:.60}")


def set_msg_field(msg: Msg, name: str, value: Any) -> None:
    if name == "content_parts":
        value = [tuple(as_str(x) for x in part) for part in value]
    elif name == "tool_calls":
        value = [as_call(x) for x in value]
    elif name in MSG_FIELDS:
        value = as_str(value)
    else:
        raise Unported(f"common_chat_msg has no field {name}")
    setattr(msg, name, value)


def convert(value: Any, typename: str) -> Any:
    """A declared variable's value from its initializer (brace lists become the declared type)."""
    t = typename.replace("const", "").replace("static", "").replace(" ", "")
    if t in ("common_chat_msg",):
        return as_msg(value)
    if t == "common_chat_tool":
        return as_tool(value)
    if t == "common_chat_tool_call":
        return as_call(value)
    if t in ("std::string", "char*"):
        return as_str(value)
    if t == "std::vector<common_chat_tool>":
        return [as_tool(x) for x in value]
    if t == "std::vector<common_chat_msg>":
        return [as_msg(x) for x in value]
    if t in ("auto", "bool", "int", "size_t"):
        return value
    raise Unported(f"a variable of type {typename}")


def default_of(typename: str) -> Any:
    t = typename.replace("const", "").replace("static", "").replace(" ", "")
    if t == "common_chat_msg":
        return Msg()
    if t == "common_chat_tool":
        return Tool()
    if t in ("std::string",):
        return ""
    if t == "bool":
        return False
    return Opaque(typename)


def simple_assist_msg(content="", reasoning_content="", tool_name="", arguments="", id=""):
    msg = Msg(role="assistant", content=as_str(content), reasoning_content=as_str(reasoning_content))
    if tool_name or id:
        msg.tool_calls.append(Call(as_str(tool_name), as_str(arguments), as_str(id)))
    return msg


def multiple_calls(reasoning, content, calls):
    msg = Msg(role="assistant", content=as_str(content), reasoning_content=as_str(reasoning))
    for pair in calls:
        name, args = pair
        msg.tool_calls.append(Call(as_str(name), as_str(args), ""))
    return msg


# The C++ test file's message helpers (defined near its top), as written there.
NATIVE = {
    "simple_assist_msg": simple_assist_msg,
    "message_with_tool_calls": lambda name, args: simple_assist_msg("", "", name, args),
    "message_with_tool_calls_and_reasoning": lambda name, args, reasoning: simple_assist_msg("", reasoning, name,
                                                                                               args),
    "message_with_reasoning_content_and_multiple_tool_calls": multiple_calls,
    "message_with_content_and_tool_call": lambda content, name, args: simple_assist_msg(content, "", name, args),
    "message_with_reasoning_and_tool_call": lambda reasoning, name, args: simple_assist_msg("", reasoning, name,
                                                                                             args),
    "std::string": lambda s="": as_str(s),
}


# ---------------------------------------------------------------------------------------------------- interpreter

class Interpreter:
    def __init__(self, src: str):
        self.src_lines = src.split("\n")
        self.toks, self.comments = tokenize(src)
        self.globals: dict[str, Any] = {}
        self.functions: dict[str, Function] = {}
        self.cases: list[dict] = []
        self.not_ported: list[dict] = []
        self.runs_done: set[int] = set()  # token positions of executed `.run`
        self.run_positions = [t.pos for t in self.toks
                              if t.kind == "id" and t.value == "run" and t.pos > 0 and is_op(self.toks[t.pos - 1], ".")
                              and is_op(self.toks[t.pos + 1], "(")]
        self.reported_ranges: list[tuple[int, int]] = []  # token ranges reported as not ported
        self.testers_made: dict[int, int] = {}  # peg_tester(...) call position -> times executed
        self.case_sites: list[int] = []  # each case's peg_tester call position
        self.read_top_level()

    # -- top level: globals, functions, types

    def read_top_level(self) -> None:
        toks, i = self.toks, 0
        while i < len(toks):
            start = i
            if toks[i].kind == "id" and toks[i].value in ("struct", "class", "enum", "namespace", "union"):
                j = i
                while not (is_op(toks[j], "{") or is_op(toks[j], ";")):
                    j += 1
                if is_op(toks[j], "{"):
                    j = matching(toks, j)
                    while not is_op(toks[j], ";"):
                        j += 1
                i = j + 1
                continue
            if toks[i].kind == "id" and toks[i].value == "template":
                i = matching_angle(toks, i + 1) + 1
                continue
            j = i
            while True:
                t = toks[j]
                if is_op(t, ";"):
                    self.global_declaration(start, j)
                    i = j + 1
                    break
                if is_op(t, "(") or is_op(t, "["):
                    close = matching(toks, j)
                    after = close + 1
                    while toks[after].kind == "id" and toks[after].value in ("const", "override", "noexcept"):
                        after += 1
                    if is_op(t, "(") and is_op(toks[after], "{") and not any(is_op(x, "=") for x in toks[start:j]):
                        self.define_function(start, j, close, after)
                        i = matching(toks, after) + 1
                        break
                    if is_op(t, "(") and is_op(toks[after], ":"):  # constructor with an initializer list
                        k = after
                        while not is_op(toks[k], "{") or is_op(toks[k - 1], "("):
                            k = matching(toks, k) if is_op(toks[k], "(") else k + 1
                        i = matching(toks, k) + 1
                        break
                    j = close + 1
                    continue
                if is_op(t, "{"):
                    j = matching(toks, j) + 1
                    continue
                j += 1

    def define_function(self, start: int, lparen: int, rparen: int, lbrace: int) -> None:
        name_tok = self.toks[lparen - 1]
        name = name_tok.value
        if lparen >= 2 and is_op(self.toks[lparen - 2], "::"):
            name = self.toks[lparen - 3].value + "::" + name
        params = []
        for group in split_commas(self.toks, lparen + 1, rparen):
            ids = [t for t in group if t.kind == "id"]
            eq = next((k for k, t in enumerate(group) if is_op(t, "=")), None)
            named = [t for t in (group[:eq] if eq is not None else group) if t.kind == "id"]
            if ids:
                params.append(named[-1].value)
        self.functions.setdefault(name, Function(name, params, (lbrace, matching(self.toks, lbrace)), name_tok.line))

    def global_declaration(self, start: int, end: int) -> None:
        toks = self.toks[start:end]
        if not toks or toks[0].kind != "id" or toks[0].value in ("using", "typedef", "extern"):
            return
        try:
            self.declare(start, end, self.globals)
        except Unported:
            pass  # a global the cases never use; one they use is reported where it is used

    # -- statements

    def run_function(self, name: str, args: list[Any]) -> None:
        fn = self.functions[name]
        scope = {"__parent__": self.globals}
        for p, a in zip(fn.params, args):
            scope[p] = a
        self.exec_block(fn.body[0], fn.body[1], scope)

    def exec_block(self, lbrace: int, rbrace: int, parent: dict) -> None:
        scope = {"__parent__": parent}
        i = lbrace + 1
        while i < rbrace:
            end = self.statement_end(i)
            try:
                self.exec_statement(i, end, scope)
            except Unported as exc:
                if not self.holds_cases(lbrace, rbrace):
                    self.report(lbrace, rbrace, str(exc))
                    return
                self.report(i, end, str(exc))
            i = end + 1

    def holds_cases(self, a: int, b: int) -> bool:
        return any(a <= p <= b for p in self.run_positions)

    def statement_end(self, i: int) -> int:
        """The last token index of the statement starting at i."""
        toks = self.toks
        t = toks[i]
        if is_op(t, "{"):
            return matching(toks, i)
        if t.kind == "id" and t.value in ("if", "for", "while", "switch"):
            end = self.statement_end(matching(toks, i + 1) + 1)
            if t.value == "if" and toks[end + 1].kind == "id" and toks[end + 1].value == "else":
                end = self.statement_end(end + 2)
            return end
        if t.kind == "id" and t.value == "try":
            end = matching(toks, i + 1)
            while toks[end + 1].kind == "id" and toks[end + 1].value == "catch":
                end = matching(toks, matching(toks, end + 2) + 1)
            return end
        if t.kind == "id" and t.value == "do":
            return until_semicolon(toks, self.statement_end(i + 1) + 1)
        if t.kind == "id" and t.value in ("struct", "class"):
            return until_semicolon(toks, i)
        return until_semicolon(toks, i)

    def exec_statement(self, i: int, end: int, scope: dict) -> None:
        toks = self.toks
        t = toks[i]
        if is_op(t, "{"):
            self.exec_block(i, end, scope)
            return
        if is_op(t, ";"):
            return
        if t.kind == "id" and t.value == "for":
            self.exec_for(i, end, scope)
            return
        if t.kind == "id" and t.value.startswith("LOG_"):
            return  # logging
        if t.kind == "id" and t.value in ("if", "while", "switch", "try", "do", "return", "throw", "struct", "class",
                                          "GGML_ASSERT", "assert"):
            raise Unported(f"a `{t.value}` statement")
        if self.is_declaration(i, end):
            self.declare(i, end, scope)
            return
        self.expression_statement(i, end, scope)

    def exec_for(self, i: int, end: int, scope: dict) -> None:
        toks = self.toks
        rparen = matching(toks, i + 1)
        colon = next((k for k in range(i + 2, rparen) if is_op(toks[k], ":")), None)
        if colon is None:
            raise Unported("a counted `for` loop")
        var = toks[colon - 1].value
        items = Evaluator(self, toks, colon + 1, rparen, scope).whole()
        if not isinstance(items, list):
            raise Unported("a `for` over something not a brace list")
        body = rparen + 1
        body_end = self.statement_end(body)
        for item in items:
            inner = {"__parent__": scope, var: item}
            if is_op(toks[body], "{"):
                self.exec_block(body, body_end, inner)
            else:
                self.exec_statement(body, body_end, inner)

    def is_declaration(self, i: int, end: int) -> bool:
        toks = self.toks
        j = i
        while toks[j].kind == "id" and toks[j].value in ("static", "const", "constexpr"):
            j += 1
        if toks[j].kind != "id":
            return False
        if toks[j].value == "auto":
            return True
        nxt = toks[j + 1]
        return nxt.kind == "id" or (nxt.kind == "op" and nxt.value in ("::", "<", "*", "&"))

    def declare(self, i: int, end: int, scope: dict) -> None:
        """TYPE NAME; / TYPE NAME = EXPR; / TYPE NAME{...};"""
        toks = self.toks
        j, angle = i, 0
        while j < end:
            t = toks[j]
            if is_op(t, "<"):
                angle += 1
            elif is_op(t, ">"):
                angle -= 1
            elif is_op(t, ">>"):
                angle -= 2
            elif angle == 0 and t.kind == "op" and t.value in ("=", "{", "("):
                break
            j += 1
        name_tok = toks[j - 1]
        if name_tok.kind != "id":
            raise Unported("a declaration")
        typename = " ".join(str(t.value) for t in toks[i:j - 1])
        if j == end:
            value = default_of(typename)
        elif is_op(toks[j], "="):
            value = convert(Evaluator(self, toks, j + 1, end, scope).whole(), typename)
        elif is_op(toks[j], "{"):
            value = convert(Evaluator(self, toks, j, end, scope).whole(), typename)
        else:
            raise Unported(f"a constructor call declaring {name_tok.value}")
        scope[name_tok.value] = value

    def expression_statement(self, i: int, end: int, scope: dict) -> None:
        toks = self.toks
        eq, k = None, i
        while k < end:  # an `=` outside brackets makes it an assignment
            if toks[k].kind == "op" and toks[k].value in "({[":
                k = matching(toks, k)
            elif is_op(toks[k], "="):
                eq = k
                break
            k += 1
        if eq is None:
            Evaluator(self, toks, i, end, scope).whole()
            return
        value = Evaluator(self, toks, eq + 1, end, scope).whole()
        target = toks[i:eq]
        if len(target) == 3 and target[0].kind == "id" and is_op(target[1], ".") and target[2].kind == "id":
            obj = lookup(scope, target[0].value)
            if isinstance(obj, Msg):
                set_msg_field(obj, target[2].value, value)
                return
            raise Unported(f"assigns {target[0].value}.{target[2].value} (a {type(obj).__name__})")
        if len(target) == 1 and target[0].kind == "id":
            assign(scope, target[0].value, value)
            return
        raise Unported("an assignment")

    # -- cases

    def record(self, b: Builder) -> None:
        """One case from a builder at its `.run()`."""
        c = b.case
        if not (TEMPLATES / c["template"]).is_file():
            raise Unported(f"the template {c['template']} is not in tests/data/templates/")
        expect: Msg = c["expect"]
        if expect.content_parts:
            raise Unported("an expected message with content parts")
        index = sum(1 for x in self.cases if x["template"] == c["template"])
        slug = self.slug_for(b.line) or auto_slug(c)
        stem = c["template"].removesuffix(".jinja")
        self.case_sites.append(b.tester.site)
        self.cases.append({
            "id": f"{stem}/{index:03d}" + (f"-{slug}" if slug else ""),
            "template": c["template"],
            "cpp_line": b.line,
            "input": c["input"],
            "tools": [tool_json(t) for t in c["tools"]] or None,
            "reasoning_format": c["reasoning_format"],
            "enable_thinking": c["enable_thinking"],
            "parallel_tool_calls": c["parallel_tool_calls"],
            "tool_choice": c["tool_choice"],
            "json_schema": c["json_schema"],
            "is_partial": c["is_partial"],
            "messages": [message_json(m) for m in c["messages"]] if c["messages"] is not None else None,
            "add_generation_prompt": c["add_generation_prompt"],
            "continue_final_message": c["continue_final_message"],
            "expect_reconstruction": c["expect_reconstruction"],
            "expect": {"content": expect.content, "reasoning": expect.reasoning_content,
                       "tool_calls": [{"name": t.name, "arguments": t.arguments, "id": t.id} for t in expect.tool_calls]},
        })

    # -- reports

    def report(self, a: int, b: int, why: str) -> None:
        text = self.token_text(a, b)
        for needle, reason in REGION_REASONS:
            if needle in text:
                why = reason
                break
        self.reported_ranges.append((a, b))
        first, last = self.toks[a].line, self.toks[b].line
        runs = sum(1 for p in self.run_positions if a <= p <= b)
        what = next((ln.strip() for ln in self.src_lines[first - 1:last] if ln.strip() not in ("", "{", "}")), "")
        entry = {"where": f"tests/test-chat.cpp:{first}-{last}", "what": what.lstrip("/ ")[:100],
                 "reason": why, "cases_in_it": runs}
        self.not_ported.append(entry)

    def token_text(self, a: int, b: int) -> str:
        return "\n".join(self.src_lines[self.toks[a].line - 1:self.toks[b].line])

    def slug_for(self, line: int) -> str:
        """A few words naming a case: the `//` comment just above its tst.test(...) line, if any."""
        for ln in range(line - 1, max(line - 4, 0), -1):
            text = self.src_lines[ln - 1].strip()
            if ln in self.comments and text.startswith("//"):
                words = re.findall(r"[A-Za-z0-9]+", self.comments[ln].lower())
                return "-".join(words[:6])[:48].strip("-")
            if text and not text.startswith("//"):
                break
        return ""


def lookup(scope: dict, name: str) -> Any:
    s = scope
    while s is not None:
        if name in s:
            return s[name]
        s = s.get("__parent__")
    raise KeyError(name)


def assign(scope: dict, name: str, value: Any) -> None:
    s = scope
    while s is not None:
        if name in s:
            s[name] = value
            return
        s = s.get("__parent__")
    raise Unported(f"assigns the undeclared {name}")


def split_commas(toks: list[Tok], a: int, b: int) -> list[list[Tok]]:
    """toks[a:b] split at the commas outside brackets (and outside <...> of a type)."""
    groups, cur, k, angle = [], [], a, 0
    while k < b:
        t = toks[k]
        if t.kind == "op" and t.value in "({[":
            close = matching(toks, k)
            cur.extend(toks[k:close + 1])
            k = close + 1
            continue
        if is_op(t, "<"):
            angle += 1
        elif is_op(t, ">"):
            angle = max(0, angle - 1)
        if is_op(t, ",") and angle == 0:
            groups.append(cur)
            cur = []
        else:
            cur.append(t)
        k += 1
    if cur:
        groups.append(cur)
    return groups


def matching_angle(toks: list[Tok], i: int) -> int:
    depth, j = 0, i
    while True:
        if is_op(toks[j], "<"):
            depth += 1
        elif is_op(toks[j], ">"):
            depth -= 1
            if depth == 0:
                return j
        j += 1


class Evaluator:
    """Evaluates the expression toks[a:b]: literals, names, brace lists, calls, `+` on strings, method chains."""

    def __init__(self, interp: Interpreter, toks: list[Tok], a: int, b: int, scope: dict):
        self.interp, self.toks, self.i, self.b, self.scope = interp, toks, a, b, scope

    def whole(self) -> Any:
        value = self.additive()
        if self.i != self.b:
            t = self.toks[self.i]
            raise Unported(f"the expression at `{t.value!s}` (line {t.line})")
        return value

    def peek(self) -> Optional[Tok]:
        return self.toks[self.i] if self.i < self.b else None

    def take(self, value: Optional[str] = None) -> Tok:
        t = self.toks[self.i]
        if value is not None and not (t.kind == "op" and t.value == value):
            raise Unported(f"expected `{value}` at line {t.line}, got `{t.value!s}`")
        self.i += 1
        return t

    def additive(self) -> Any:
        value = self.postfix()
        while (t := self.peek()) is not None and is_op(t, "+"):
            self.take()
            right = self.postfix()
            if not (isinstance(value, str) and isinstance(right, str)):
                raise Unported("`+` on something not a string")
            value = value + right
        return value

    def args(self) -> list[Any]:
        self.take("(")
        close = matching(self.toks, self.i - 1)
        out = []
        for group in split_commas(self.toks, self.i, close):
            a = group[0].pos
            out.append(Evaluator(self.interp, self.toks, a, group[-1].pos + 1, self.scope).whole())
        self.i = close + 1
        return out

    def postfix(self) -> Any:
        value = self.primary()
        while (t := self.peek()) is not None:
            if is_op(t, "."):
                self.take()
                name_tok = self.take()
                args = self.args() if (p := self.peek()) is not None and is_op(p, "(") else None
                value = self.member(value, name_tok, args)
            else:
                break
        return value

    def primary(self) -> Any:
        t = self.take()
        if t.kind == "str":
            data = t.value
            while (p := self.peek()) is not None and p.kind == "str":
                data += self.take().value
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise Unported(f"a string literal that is not UTF-8 (line {t.line})") from None
        if t.kind == "num":
            try:
                return int(t.value)
            except ValueError:
                raise Unported(f"the number {t.value}") from None
        if is_op(t, "{"):
            close = matching(self.toks, t.pos)
            items = [Evaluator(self.interp, self.toks, g[0].pos, g[-1].pos + 1, self.scope).whole()
                     for g in split_commas(self.toks, t.pos + 1, close)]
            self.i = close + 1
            return items
        if is_op(t, "("):
            close = matching(self.toks, t.pos)
            value = Evaluator(self.interp, self.toks, t.pos + 1, close, self.scope).whole()
            self.i = close + 1
            return value
        if t.kind != "id":
            raise Unported(f"`{t.value!s}` (line {t.line})")
        name = t.value
        while (p := self.peek()) is not None and is_op(p, "::"):
            self.take()
            name += "::" + self.take().value
        if name in ("true", "false"):
            return name == "true"
        for table in (REASONING_FORMATS, TOOL_CHOICES, CONTINUATIONS):
            if name in table:
                return ("enum", name)
        p = self.peek()
        if p is not None and is_op(p, "("):
            args = self.args()
            return self.call(name, args, t)
        if p is not None and is_op(p, "{") and name in ("common_chat_tool", "common_chat_msg", "common_chat_tool_call"):
            braced = self.primary()
            return convert(braced, name)
        try:
            return lookup(self.scope, name)
        except KeyError:
            raise Unported(f"uses `{name}` (line {t.line})") from None

    def call(self, name: str, args: list[Any], t: Tok) -> Any:
        if name == "peg_tester":
            self.interp.testers_made[t.pos] = self.interp.testers_made.get(t.pos, 0) + 1
            return Tester(Path(as_str(args[0])).name, t.pos)
        if name in NATIVE:
            return NATIVE[name](*args)
        if name in self.interp.functions and name.startswith("test_"):
            self.interp.run_function(name, args)
            return None
        raise Unported(f"calls `{name}` (line {t.line})")

    def member(self, obj: Any, name_tok: Tok, args: Optional[list[Any]]) -> Any:
        name = name_tok.value
        if isinstance(obj, Tester) and name == "test" and args is not None:
            case = new_case(obj.template, as_str(args[0]))
            return Builder(obj, name_tok.line, case)
        if isinstance(obj, Builder) and args is not None:
            return self.builder_method(obj, name_tok, args)
        if isinstance(obj, Msg) and args is None and name in MSG_FIELDS:
            return getattr(obj, name)
        raise Unported(f"`.{name}` on a {type(obj).__name__} (line {name_tok.line})")

    def builder_method(self, b: Builder, name_tok: Tok, args: list[Any]) -> Any:
        name, c = name_tok.value, b.case
        arg = args[0] if args else None
        if name == "run":
            self.interp.record(b)
            self.interp.runs_done.add(name_tok.pos)
            return None
        if name == "reasoning_format":
            c["reasoning_format"] = REASONING_FORMATS[enum(arg)]
        elif name == "tool_choice":
            c["tool_choice"] = TOOL_CHOICES[enum(arg)]
        elif name == "continue_final_message":
            c["continue_final_message"] = CONTINUATIONS[enum(arg)]
        elif name in ("enable_thinking", "parallel_tool_calls", "add_generation_prompt", "is_partial"):
            if not isinstance(arg, bool):
                raise Unported(f".{name} with {arg!r}")
            c[name] = arg
        elif name == "expect_reconstruction":
            c["expect_reconstruction"] = True if arg is None else bool(arg)
        elif name == "json_schema":
            c["json_schema"] = json.loads(as_str(arg))
        elif name == "tools":
            c["tools"] = [as_tool(x) for x in arg]
        elif name == "messages":
            c["messages"] = [as_msg(x) for x in arg]
        elif name == "expect":
            c["expect"] = as_msg(arg)
        elif name == "expect_content":
            c["expect"].content = as_str(arg)
        elif name == "expect_reasoning":
            c["expect"].reasoning_content = as_str(arg)
        elif name == "expect_tool_calls":
            c["expect"].tool_calls = [as_call(x) for x in arg]
        else:
            raise Unported(f"`.{name}(...)` (line {name_tok.line})")
        return b


def enum(v: Any) -> str:
    if isinstance(v, tuple) and v[0] == "enum":
        return v[1]
    raise Unported(f"expected an enum constant, got {v!r}")


def new_case(template: str, text: str) -> dict:
    """A case as llama.cpp's peg_test_builder starts it: common_chat_templates_inputs' defaults (chat.h), with
    add_generation_prompt set true by the builder."""
    return {"template": template, "input": text, "tools": [], "reasoning_format": "none", "enable_thinking": True,
            "parallel_tool_calls": False, "tool_choice": "auto", "json_schema": None, "is_partial": False,
            "messages": None, "add_generation_prompt": True, "continue_final_message": None,
            "expect_reconstruction": False, "expect": Msg()}


# ---------------------------------------------------------------------------------------------------- records

def tool_json(tool: Tool) -> dict:
    """common_chat_tools_to_json_oaicompat: the parameters are parsed from their JSON text."""
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": json.loads(tool.parameters)}}


def message_json(msg: Msg) -> dict:
    """common_chat_msg::to_json_oaicompat (typed content parts kept as parts)."""
    out: dict[str, Any] = {"role": msg.role}
    if msg.content:
        out["content"] = msg.content
    elif msg.content_parts:
        out["content"] = [{"type": t, "text": text} for t, text in msg.content_parts]
    else:
        out["content"] = ""
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_name:
        out["name"] = msg.tool_name
    if msg.tool_call_id:
        out["tool_call_id"] = msg.tool_call_id
    if msg.tool_calls:
        out["tool_calls"] = []
        for call in msg.tool_calls:
            tc: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            if call.id:
                tc["id"] = call.id
            out["tool_calls"].append(tc)
    return out


def auto_slug(c: dict) -> str:
    e: Msg = c["expect"]
    words = []
    if c["continue_final_message"]:
        words.append("continue-" + c["continue_final_message"])
    if c["json_schema"] is not None:
        words.append("schema")
    if e.reasoning_content:
        words.append("reasoning")
    if e.content:
        words.append("content")
    if e.tool_calls:
        words.append("call" if len(e.tool_calls) == 1 else f"{len(e.tool_calls)}-calls")
    if c["is_partial"]:
        words.append("partial")
    return "-".join(words)


# ---------------------------------------------------------------------------------------------------- llama.cpp

# Runs every case through llama.cpp's own chat code, as test-chat.cpp's test_peg_parser does (prompt and parser from
# common_chat_templates_apply, the whole input parsed, then every UTF-8-safe prefix with compute_diffs accumulated),
# and writes per case the generation prompt and whether both readings equal the case's expectation.
HARNESS = r"""
#include "chat.h"
#include "common.h"
#include "log.h"
#include <nlohmann/json.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

using ojson = nlohmann::ordered_json;

static std::string read_file(const std::string & path) {
    std::ifstream fs(path, std::ios_base::binary);
    std::stringstream ss;
    ss << fs.rdbuf();
    return ss.str();
}

static common_chat_msg msg_from(const ojson & j) {
    common_chat_msg m;
    m.role = j.at("role").get<std::string>();
    if (j["content"].is_string()) {
        m.content = j["content"].get<std::string>();
    } else {
        for (const auto & p : j["content"]) {
            m.content_parts.push_back({ p.at("type").get<std::string>(), p.at("text").get<std::string>() });
        }
    }
    if (j.contains("reasoning_content")) m.reasoning_content = j["reasoning_content"].get<std::string>();
    if (j.contains("name")) m.tool_name = j["name"].get<std::string>();
    if (j.contains("tool_call_id")) m.tool_call_id = j["tool_call_id"].get<std::string>();
    if (j.contains("tool_calls")) {
        for (const auto & tc : j["tool_calls"]) {
            m.tool_calls.push_back({ tc["function"]["name"].get<std::string>(),
                                     tc["function"]["arguments"].get<std::string>(),
                                     tc.contains("id") ? tc["id"].get<std::string>() : "" });
        }
    }
    return m;
}

static ojson msg_json(const common_chat_msg & m) {
    ojson calls = ojson::array();
    for (const auto & tc : m.tool_calls) {
        calls.push_back({ { "name", tc.name }, { "arguments", tc.arguments }, { "id", tc.id } });
    }
    return { { "content", m.content }, { "reasoning", m.reasoning_content }, { "tool_calls", calls } };
}

static std::string renormalize_json(const std::string & s) {
    try { return ojson::parse(s).dump(); } catch (...) { return ""; }
}

// test-chat.cpp's assert_msg_equals(..., ignore_whitespace_differences = true)
static bool same(const common_chat_msg & a, const common_chat_msg & b) {
    if (string_strip(a.content) != string_strip(b.content)) return false;
    if (string_strip(a.reasoning_content) != string_strip(b.reasoning_content)) return false;
    if (a.tool_calls.size() != b.tool_calls.size()) return false;
    for (size_t i = 0; i < a.tool_calls.size(); i++) {
        if (a.tool_calls[i].name != b.tool_calls[i].name) return false;
        if (renormalize_json(a.tool_calls[i].arguments) != renormalize_json(b.tool_calls[i].arguments)) return false;
        if (a.tool_calls[i].id != b.tool_calls[i].id) return false;
    }
    return true;
}

static size_t utf8_truncate_safe_len(const std::string_view s) {
    auto len = s.size();
    if (len == 0) return 0;
    auto i = len;
    for (size_t back = 0; back < 4 && i > 0; ++back) {
        --i;
        unsigned char c = s[i];
        if ((c & 0x80) == 0) return len;
        if ((c & 0xC0) == 0xC0) {
            size_t expected_len = 0;
            if ((c & 0xE0) == 0xC0) expected_len = 2;
            else if ((c & 0xF0) == 0xE0) expected_len = 3;
            else if ((c & 0xF8) == 0xF0) expected_len = 4;
            else return i;
            return len - i >= expected_len ? len : i;
        }
    }
    return len - std::min(len, size_t(3));
}

int main(int, char ** argv) {
    common_log_set_verbosity_thold(-1);
    auto data = ojson::parse(read_file(argv[1]));
    std::string templates = argv[2];
    ojson out = ojson::array();
    for (const auto & c : data["cases"]) {
        ojson r;
        r["id"] = c["id"];
        try {
            auto tmpls = common_chat_templates_ptr(common_chat_templates_init(
                nullptr, read_file(templates + "/" + c["template"].get<std::string>())));
            common_chat_templates_inputs in;
            if (c["messages"].is_null()) {
                common_chat_msg user;
                user.role = "user";
                user.content = "Hey there!";
                in.messages = { user };
            } else {
                for (const auto & m : c["messages"]) in.messages.push_back(msg_from(m));
            }
            if (!c["tools"].is_null()) {
                for (const auto & t : c["tools"]) {
                    in.tools.push_back({ t["function"]["name"].get<std::string>(),
                                         t["function"]["description"].get<std::string>(),
                                         t["function"]["parameters"].dump() });
                }
            }
            auto rf = c["reasoning_format"].get<std::string>();
            in.reasoning_format = rf == "auto" ? COMMON_REASONING_FORMAT_AUTO
                                : rf == "deepseek" ? COMMON_REASONING_FORMAT_DEEPSEEK
                                : rf == "deepseek_legacy" ? COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY
                                : COMMON_REASONING_FORMAT_NONE;
            in.enable_thinking = c["enable_thinking"].get<bool>();
            in.parallel_tool_calls = c["parallel_tool_calls"].get<bool>();
            auto tc = c["tool_choice"].get<std::string>();
            in.tool_choice = tc == "required" ? COMMON_CHAT_TOOL_CHOICE_REQUIRED
                           : tc == "none" ? COMMON_CHAT_TOOL_CHOICE_NONE : COMMON_CHAT_TOOL_CHOICE_AUTO;
            if (!c["json_schema"].is_null()) in.json_schema = c["json_schema"].dump();
            in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
            if (!c["continue_final_message"].is_null()) {
                auto k = c["continue_final_message"].get<std::string>();
                in.continue_final_message = k == "content" ? COMMON_CHAT_CONTINUATION_CONTENT
                                          : k == "reasoning" ? COMMON_CHAT_CONTINUATION_REASONING
                                          : COMMON_CHAT_CONTINUATION_AUTO;
            }
            auto params = common_chat_templates_apply(tmpls.get(), in);
            r["generation_prompt"] = params.generation_prompt;
            common_peg_arena arena;
            arena.load(params.parser);
            common_chat_parser_params pp(params);

            common_chat_msg expect;
            expect.content = c["expect"]["content"].get<std::string>();
            expect.reasoning_content = c["expect"]["reasoning"].get<std::string>();
            for (const auto & t : c["expect"]["tool_calls"]) {
                expect.tool_calls.push_back({ t["name"].get<std::string>(), t["arguments"].get<std::string>(),
                                              t["id"].get<std::string>() });
            }
            auto input = c["input"].get<std::string>();
            bool partial = c["is_partial"].get<bool>();
            if (!partial) {
                auto whole = common_chat_peg_parse(arena, input, false, pp);
                if (!same(expect, whole)) r["whole"] = msg_json(whole);
                if (c["expect_reconstruction"].get<bool>()) {
                    // the expectation (its calls' argument text as parsed) rendered after the messages
                    auto message = expect;
                    message.role = "assistant";
                    for (size_t i = 0; i < message.tool_calls.size() && i < whole.tool_calls.size(); i++) {
                        message.tool_calls[i].arguments = whole.tool_calls[i].arguments;
                    }
                    auto again = in;
                    again.messages.push_back(message);
                    again.add_generation_prompt = false;
                    auto rendered = common_chat_templates_apply(tmpls.get(), again).prompt;
                    auto written = params.prompt + input;
                    if (rendered.compare(0, written.size(), written) != 0) r["reconstruction"] = rendered;
                }
            }
            common_chat_msg prev, accum;
            for (size_t i = 1; i <= input.size(); ++i) {
                auto prefix = input.substr(0, utf8_truncate_safe_len(std::string_view(input).substr(0, i)));
                auto cur = common_chat_peg_parse(arena, prefix, i < input.size() || partial, pp);
                for (const auto & d : common_chat_msg_diff::compute_diffs(prev, cur)) {
                    accum.reasoning_content += d.reasoning_content_delta;
                    accum.content += d.content_delta;
                    if (d.tool_call_index != std::string::npos) {
                        while (accum.tool_calls.size() <= d.tool_call_index) accum.tool_calls.push_back({ "", "", "" });
                        auto & call = accum.tool_calls[d.tool_call_index];
                        if (!d.tool_call_delta.name.empty()) call.name = d.tool_call_delta.name;
                        if (!d.tool_call_delta.id.empty()) call.id = d.tool_call_delta.id;
                        call.arguments += d.tool_call_delta.arguments;
                    }
                }
                if (!same(cur, accum) && !r.contains("stream_error")) {
                    r["stream_error"] = "the accumulated deltas differ from the reading at byte " + std::to_string(i);
                }
                prev = cur;
            }
            if (!same(expect, accum)) r["accumulated"] = msg_json(accum);
        } catch (const std::exception & e) {
            r["error"] = e.what();
        }
        out.push_back(r);
    }
    std::cout << out.dump() << std::endl;
    return 0;
}
"""


def run_llama(cases: list[dict], llama_src: Path, build: Path) -> list[dict]:
    """HARNESS compiled against a llama.cpp build's static libraries (BUILD_SHARED_LIBS=OFF) and run over the
    cases: llama.cpp's result for each."""
    libs = sorted(str(p) for p in build.rglob("lib*.a") if "llama" in p.name or "ggml" in p.name)
    if not any(Path(p).name == "libllama-common.a" for p in libs):
        sys.exit(f"{build}: no libllama-common.a: build llama.cpp with -DBUILD_SHARED_LIBS=OFF and the target "
                 "llama-common (see --help)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe, data = Path(tmp, "harness.cpp"), Path(tmp, "harness"), Path(tmp, "cases.json")
        src.write_text(HARNESS)
        data.write_text(json.dumps({"cases": cases}, ensure_ascii=False), encoding="utf-8")
        includes = [f"-I{llama_src / d}" for d in ("common", "include", "ggml/include", "vendor")]
        subprocess.run(["c++", "-std=c++17", "-O1", "-w", str(src), *includes, "-Wl,--start-group", *libs,
                        "-Wl,--end-group", "-fopenmp", "-lpthread", "-o", str(exe)], check=True)
        done = subprocess.run([str(exe), str(data), str(TEMPLATES)], check=True, capture_output=True)
    return json.loads(done.stdout)


# ---------------------------------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=BUILD_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="llama.cpp's tests/test-chat.cpp")
    ap.add_argument("--llama", type=Path, required=True, metavar="BUILD",
                    help="a static build of that llama.cpp (its libllama-common.a): runs every case through it")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    raw = args.source.read_bytes()
    interp = Interpreter(raw.decode("utf-8"))
    if ENTRY not in interp.functions:
        print(f"{args.source}: no function {ENTRY}: not llama.cpp's test-chat.cpp?", file=sys.stderr)
        return 1
    interp.run_function(ENTRY, [False])
    failed = check(interp)

    results = run_llama(interp.cases, args.source.resolve().parent.parent, args.llama)
    for case, result in zip(interp.cases, results):
        assert case["id"] == result["id"]
        wrong = {k: v for k, v in result.items() if k not in ("id", "generation_prompt")}
        if wrong:
            print(f"llama.cpp disagrees with {case['id']} (line {case['cpp_line']}): {wrong}", file=sys.stderr)
            failed = True
        case["generation_prompt"] = result.get("generation_prompt")
        case["expect"] = case.pop("expect")  # last, after what llama.cpp gave

    not_ported = list(interp.not_ported)
    for name, reason in OTHER_FUNCTIONS.items():
        fn = interp.functions.get(name)
        where = f"tests/test-chat.cpp:{fn.line}" if fn else "tests/test-chat.cpp"
        not_ported.append({"where": where, "what": f"{name}()", "reason": reason, "cases_in_it": 0})
    for path, reason in OTHER_FILES.items():
        not_ported.append({"where": path, "what": "the whole file", "reason": reason, "cases_in_it": 0})

    out = {
        "source": {
            "file": "tests/test-chat.cpp",
            "llama.cpp": "as vendored by llama-cpp-python 0.3.36 (vendor/llama.cpp)",
            "sha256": hashlib.sha256(raw).hexdigest(),
            "generated_by": "scripts/port_llama_chat_cases.py",
        },
        "notes": [
            "Defaults are llama.cpp's common_chat_templates_inputs: reasoning_format none, enable_thinking true, "
            "parallel_tool_calls false, tool_choice auto, add_generation_prompt true.",
            "messages null: the case renders llama.cpp's default, one user message 'Hey there!'.",
            "Messages are as common_chat_msg::to_json_oaicompat writes them (tool call arguments as JSON text).",
            "generation_prompt: what llama.cpp's common_chat_templates_apply gave (the tail its parser reads before "
            "the model's text); with continue_final_message it holds the prefilled reasoning or content.",
            "Every case was run through llama.cpp's own chat code when this file was made, and its whole and "
            "streamed readings equal the expectation.",
            "llama.cpp compares content and reasoning with surrounding whitespace stripped, arguments as parsed "
            "JSON (text that is not JSON compares as ''), ids exactly.",
        ],
        "cases": interp.cases,
        "not_ported": not_ported,
    }
    if failed:
        print(f"not written: {args.out}", file=sys.stderr)
        return 1
    args.out.write_text(dump(out), encoding="utf-8")

    counts: dict[str, int] = {}
    for c in interp.cases:
        counts[c["template"]] = counts.get(c["template"], 0) + 1
    for name in sorted(counts, key=str.lower):
        print(f"{counts[name]:4d}  {name}", file=sys.stderr)
    print(f"{len(interp.cases):4d}  cases in {len(counts)} templates, each as llama.cpp reads it -> {args.out}",
          file=sys.stderr)
    for entry in interp.not_ported:
        print(f"not ported: {entry['where']} ({entry['cases_in_it']} cases): {entry['what']}\n    {entry['reason']}",
              file=sys.stderr)
    return 0


def dump(out: dict) -> str:
    """The JSON with one case (or not-ported entry) a line: readable diffs, a case found by grepping its id."""
    parts = []
    for key, value in out.items():
        if isinstance(value, list):
            rows = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
            parts.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def check(interp: Interpreter) -> bool:
    """Nothing dropped: every `.run()` of the source executed or inside a reported region, and each peg_tester's
    cases = (its `VAR.test(` chains counted in the text) x (times it was executed). True when something is wrong."""
    toks, wrong = interp.toks, False
    for p in interp.run_positions:
        if p not in interp.runs_done and not any(a <= p <= b for a, b in interp.reported_ranges):
            print(f"check: the .run() at line {toks[p].line} was neither ported nor reported", file=sys.stderr)
            wrong = True
    for site, times in interp.testers_made.items():
        var = toks[site - 2].value if is_op(toks[site - 1], "=") else None
        block_end = min((matching(toks, k) for k in range(site) if is_op(toks[k], "{") and matching(toks, k) > site))
        chains, k = 0, site + 1
        while k < block_end:
            if toks[k].kind == "id" and toks[k].value == var and is_op(toks[k + 1], "="):
                break  # redeclared
            if (toks[k].kind == "id" and toks[k].value == var and is_op(toks[k + 1], ".")
                    and toks[k + 2].value == "test" and is_op(toks[k + 3], "(")):
                chains += 1
            k += 1
        made = interp.case_sites.count(site)
        if made != chains * times:
            print(f"check: the peg_tester at line {toks[site].line}: {made} cases, expected {chains} chains x {times}",
                  file=sys.stderr)
            wrong = True
    ids = [c["id"] for c in interp.cases]
    if len(ids) != len(set(ids)):
        print("check: duplicate case ids", file=sys.stderr)
        wrong = True
    print(f"check: {len(interp.run_positions)} .run() in the source, {len(interp.runs_done)} executed, "
          f"{len(interp.cases)} cases (loops repeat some), {len(interp.testers_made)} peg_tester sites",
          file=sys.stderr)
    return wrong


if __name__ == "__main__":
    sys.exit(main())
