"""Every model family's own chat format: which one a chat template uses (chosen from the template's text, as
llama.cpp's common/chat.cpp chooses), and reading what a model of that family writes: its thinking, its answer
and its tool calls, whole or while it streams (the text so far read as a partial message, and the deltas from
one reading to the next, as llama.cpp's common_chat_msg_diff).

    parser = parser_for(template, prompt, tools=tools)     # prompt: the rendered prompt (did it open thinking?)
    message = parser.parse(text)                           # Message(content, reasoning, calls)
    for delta in deltas(before, after): ...                # what a stream sends between two readings

The families are a table (families.py): each names its thinking markers (engine.thinking), how it writes
calls (a reader of syntax.py, parameterised by its markers) and the special tokens its output must show.
Whatever the family, what localrun read before any family had a table entry is still read (lenient.py:
fenced JSON, bare call objects, doubled braces), so a user of any model gets tool calls.
Pure functions: no llama.cpp here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

from .thinking import Markers, ThinkingSplitter, opened_in_prompt
from .syntax import Tools, held, read_answer
from .types import Delta, Message, ToolCall

__all__ = ["AnswerStream", "Delta", "Message", "Parser", "ToolCall", "deltas", "family_for", "markers_for", "parser_for",
           "prompt_tail", "supports_tools", "thinking_in"]


def family_for(template: Optional[str]):
    """The family a chat template belongs to (families.Family: the first row of the table whose markers it
    holds), or the plain family of a template that names none."""
    from .families import detect

    return detect(template or "")


def supports_tools(template: Optional[str]) -> bool:
    """Whether a chat template renders the tools it is given (it reads a `tools` variable)."""
    import re

    return bool(template) and re.search(r"\btools\b", template) is not None


@dataclass
class Parser:
    """Reads what a model answered to one prompt. `reasoning` "none" leaves the thinking inline in the content
    (llama.cpp's reasoning_format none); `tools` None reads no calls (none were offered). `tail`: the prompt's
    text after the assistant's turn began (a thinking block the template opened, an answer prefilled by the
    client): the answer goes on from there, as llama.cpp parses its generation prompt and the output together."""

    family: Any
    tail: str = ""
    tools: Optional[Tools] = None
    reasoning: str = "auto"
    parallel: bool = True
    forced: bool = False
    json_schema: bool = False  # the answer is JSON in a response format: a ```json fence around it is not its

    @property
    def markers(self) -> Optional[Markers]:
        return self.family.thinking if self.reasoning != "none" else None

    def splitter(self) -> ThinkingSplitter:
        """A fresh splitter of this answer's thinking from the rest, in the state the prompt's tail left it."""
        splitter = ThinkingSplitter(self.markers, preserved=self.family.preserved)
        splitter.feed(self.tail)
        return splitter

    def parse(self, text: str, partial: bool = False) -> Message:
        """The whole text the model wrote (its thinking included), read as a message, with what the prompt's tail
        began of it (a prefilled thinking or answer); `partial`: more may come (what is read stays read: a later
        reading only adds)."""
        splitter = ThinkingSplitter(self.markers, preserved=self.family.preserved)
        tail = self.tail
        thinking = self.family.thinking
        if self.reasoning == "none" and thinking is not None and not self.family.tail_content:
            # the thinking left inline: a thinking block the prompt's header opened (or closed) is the header's, not
            # the answer's (llama.cpp reads its generation prompt so); a prefilled answer still is the answer's
            if any(m and tail.lstrip().startswith(m) for m in (thinking.open, thinking.close, *thinking.closes)):
                tail = ""
        pieces = splitter.feed(tail + text) + ([] if partial else splitter.flush())
        thought = "".join(t for kind, t in pieces if kind == "thinking")
        answer = "".join(t for kind, t in pieces if kind == "answer")
        message = self.read(answer, partial)
        message.reasoning = (thought + message.reasoning).strip()
        return message

    def read(self, answer: str, partial: bool = False) -> Message:
        """The answer (the thinking already apart) read as content and calls. A forced call's text that is no
        call (cut short by max_tokens) is no content either: it was the grammar's, not the model's answer."""
        message = read_answer(self.family, answer, partial, self.tools, reasoning=self.reasoning)
        if self.forced and not message.calls:
            message.content = ""
        if self.json_schema:
            message.content = _unfenced(message.content, partial)
        return message


def _unfenced(text: str, partial: bool) -> str:
    if partial and "```json".startswith(text.strip()):
        return ""  # a fence may be opening
    m = re.match(r"\s*```(?:json)?\s*\n?", text)
    if m is None:
        return text
    body = text[m.end():]
    close = body.rfind("```")
    if close >= 0:
        return body[:close].rstrip()
    return body[:len(body) - held(body, ("```",))].rstrip() if partial else body


def parser_for(template: Optional[str], prompt: str = "", *, tools: Optional[list[dict[str, Any]]] = None,
               reasoning: str = "auto", parallel: bool = True, forced: bool = False, json_schema: Any = None) -> Parser:
    """The parser of the answer to `prompt` (the rendered prompt: whether it opened the thinking block, or began
    the answer) by a model with this chat template, offered `tools` (OpenAI function tools)."""
    family = family_for(template)
    return Parser(family, tail=prompt_tail(template, prompt, family), tools=Tools.of(tools) if tools else None,
                  reasoning=reasoning, parallel=parallel, forced=forced, json_schema=json_schema is not None)


def prompt_tail(template: Optional[str], prompt: str, family=None) -> str:
    """What the prompt wrote of the assistant's turn after its role header: the template's opened thinking
    ("<think>\n"), a continued answer. Found from the header the template writes for a new turn (its generation
    prompt, up to its thinking); for a template whose header is not known, the open marker it ends with."""
    family = family or family_for(template)
    header = _role_header(template or "", (family.thinking.open if family.thinking else "") or family.header_cut)
    if header:
        if family.turn:  # the header recurs within a turn: the first after another role's turn began
            others = [m.end() for m in re.finditer(family.turn, prompt)]
            at = prompt.find(header, others[-1] if others else 0)
        else:
            at = prompt.rfind(header)
        return prompt[at + len(header):] if at >= 0 else ""
    # No header known (a template with no generation prompt, as Mistral's): what follows the last special token
    # that is not the family's own thinking marker (Mistral's [/INST]).
    markers = family.thinking
    own = {markers.open, markers.close, *markers.closes} if markers else set()
    last = [m for m in _SPECIAL.finditer(prompt) if m.group(0) not in own]
    tail = prompt[last[-1].end():] if last else ""
    return tail if len(tail) < 4000 else ""


_SPECIAL = re.compile(r"\[/?[A-Z_]+\]|<\|[^|<>\s]*\|>|<｜[^｜]*｜>|</s>|<s>|<(?:start|end)_of_turn>")


@lru_cache(maxsize=64)
def _role_header(template: str, thinking_open: str) -> str:
    """The text a template writes to begin the assistant's turn (its generation prompt: what rendering with
    add_generation_prompt adds), up to an opened thinking block; "" when it cannot be told."""
    if not template:
        return ""
    from ..prompt import render_template

    probe = [{"role": "user", "content": "\u2063probe"}]
    try:
        with_turn = render_template(template, probe, add_generation_prompt=True)
        without = render_template(template, probe, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that refuses the probe: no header known
        return ""
    if not with_turn.startswith(without):
        return ""
    header = with_turn[len(without):]
    if thinking_open and thinking_open in header:
        header = header[:header.index(thinking_open)]
    return header if header.strip() else ""


def deltas(before: Message, after: Message) -> list[Delta]:
    """What a stream sends to go from one reading to the next: the text added to the reasoning and the content,
    then for the last call already seen what its arguments grew by, then each new call whole (llama.cpp's
    compute_diffs). A reading that went back (a held text given up) adds nothing where it went back."""
    out: list[Delta] = []
    if after.reasoning != before.reasoning:
        grown = _grown(before.reasoning, after.reasoning)
        if grown:
            out.append(Delta(reasoning=grown))
    if after.content != before.content:
        grown = _grown(before.content, after.content)
        if grown:
            out.append(Delta(content=grown))
    if before.calls and len(after.calls) >= len(before.calls):
        i = len(before.calls) - 1
        old, new = before.calls[i], after.calls[i]
        grown = _grown(old.arguments, new.arguments)
        if grown or old.name != new.name or old.id != new.id:
            renamed = old.name != new.name or old.id != new.id
            out.append(Delta(call_index=i, name=new.name if renamed else "", id=new.id if renamed else "", arguments=grown))
    for i in range(len(before.calls), len(after.calls)):
        call = after.calls[i]
        out.append(Delta(call_index=i, name=call.name, id=call.id, arguments=call.arguments))
    return out


def _grown(old: str, new: str) -> str:
    if new.startswith(old):
        return new[len(old):]
    return ""  # went back (or changed): what was sent stays sent


class AnswerStream:
    """A streaming answer read as it comes: `feed` the answer's text (its thinking apart) and get the deltas
    since the last reading; `finish` reads it whole (what was held comes out, a call cut short is dropped).
    Each feed reads the answer so far again (as llama.cpp's server does), so a call is found however its
    markers were split into tokens."""

    def __init__(self, parser: Parser):
        self.parser = parser
        self.text = ""
        self.last = Message()

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.text += text
        return self._read(partial=True)

    def finish(self) -> list[Delta]:
        return self._read(partial=False)

    def _read(self, partial: bool) -> list[Delta]:
        now = self.parser.read(self.text, partial)
        out = deltas(self.last, now)
        if len(now.calls) >= len(self.last.calls) or not partial:
            self.last = now
        return out


def markers_for(template: Optional[str]) -> Optional[Markers]:
    """The thinking markers a chat template's family uses, or None (not a reasoning model's template)."""
    return family_for(template).thinking


def thinking_in(template: Optional[str], prompt: str) -> Optional[tuple[Markers, bool]]:
    """(the template's markers, whether `prompt` opened the block) for a reasoning model's prompt, or None."""
    markers = markers_for(template)
    return None if markers is None else (markers, opened_in_prompt(prompt, markers))
