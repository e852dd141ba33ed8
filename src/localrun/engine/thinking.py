"""Reasoning models' thinking, kept apart from the answer: which markers a chat template uses, whether the
prompt already opened the block, and the splitter that turns streamed text into thinking and answer
pieces (a marker split across tokens is still found; text that may be the start of one is held back, as
the stop matcher holds back a possible stop).

Markers, from the template's text:
  <think> ... </think>   DeepSeek-R1 distills, Qwen3, QwQ, Phi-4-reasoning, SmolLM3 and most others; a
                          template may open the block itself at the end of the prompt ("<think>\\n")
  gpt-oss                <|channel|>analysis<|message|> ... <|end|>, the answer after
                          <|start|>assistant<|channel|>final<|message|>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Markers:
    open: str
    close: str
    answer_prefix: str = ""  # text between the end of the thinking and the answer, dropped (gpt-oss)


THINK = Markers("<think>", "</think>")
GPT_OSS = Markers("<|channel|>analysis<|message|>", "<|end|>", "<|start|>assistant<|channel|>final<|message|>")


def markers_for(template: Optional[str]) -> Optional[Markers]:
    """The thinking markers a chat template uses, or None (not a reasoning model's template)."""
    text = template or ""
    if "<|channel|>" in text and "analysis" in text:
        return GPT_OSS
    if "<think>" in text or "</think>" in text:
        return THINK
    return None


def opened_in_prompt(prompt: str, markers: Markers) -> bool:
    """Whether the prompt ends inside an open thinking block (the template opened it): the answer then
    starts with thinking, without the open marker."""
    tail = prompt.rstrip()
    return tail.endswith(markers.open.rstrip())


def opens_for(markers: Markers, opened: bool, sampling) -> bool:
    """Whether the answer starts inside the thinking: the prompt opened the block, unless a grammar or JSON
    schema constrains the output and cannot write the close marker (JSON asked of a reasoning model: the
    constrained text is the answer, not its thinking)."""
    if not opened:
        return False
    if getattr(sampling, "json_schema", None) is not None:
        return False
    grammar = getattr(sampling, "grammar", None)
    return grammar is None or markers.close in grammar


def thinking_in(template: Optional[str], prompt: str) -> Optional[tuple[Markers, bool]]:
    """(the template's markers, whether `prompt` opened the block) for a reasoning model's prompt, or None."""
    markers = markers_for(template)
    return None if markers is None else (markers, opened_in_prompt(prompt, markers))


def splitter_for(thinking: Optional[tuple[Markers, bool]], sampling=None) -> Optional["ThinkingSplitter"]:
    """A fresh splitter for the answer to a prompt whose thinking_in() is `thinking`, sampled with `sampling`."""
    if thinking is None:
        return None
    markers, opened = thinking
    return ThinkingSplitter(markers, inside=opens_for(markers, opened, sampling))


def has_switch(template: Optional[str]) -> bool:
    """Whether the template can turn thinking on and off (Qwen3's `enable_thinking`)."""
    return "enable_thinking" in (template or "")


class ThinkingSplitter:
    """Feed decoded text; get back [(kind, text)] with kind "thinking" or "answer". Markers never appear in
    the output; whitespace right after the thinking (before the answer) is dropped."""

    def __init__(self, markers: Markers, *, inside: bool = False):
        self.markers = markers
        self.inside = inside  # in the thinking now
        self.thought = inside  # a thinking block has been seen
        self._pending = ""
        self._after_close = False  # just left the thinking: drop the blank (and the answer prefix) before the answer
        self._answered = False

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf = self._pending + text
        self._pending = ""
        while buf:
            if self.inside:
                i = buf.find(self.markers.close)
                if i >= 0:
                    out.append(("thinking", buf[:i]))
                    buf = buf[i + len(self.markers.close):]
                    self.inside, self._after_close = False, True
                    continue
                keep = _partial_suffix(buf, self.markers.close)
                out.append(("thinking", buf[: len(buf) - keep]))
                self._pending = buf[len(buf) - keep:]
                break
            if self._after_close:
                buf, done = self._skip_gap(buf)
                if not done:
                    self._pending = buf
                    break
                continue
            if not self._answered:  # a block may open only before the answer has begun
                stripped = buf.lstrip()
                if stripped.startswith(self.markers.open):
                    buf = stripped[len(self.markers.open):]
                    self.inside = self.thought = True
                    continue
                if self.markers.open.startswith(stripped):  # may still become the open marker
                    self._pending = buf
                    break
            out.append(("answer", buf))
            self._answered = self._answered or bool(buf.strip())
            break
        return [(kind, t) for kind, t in out if t]

    def marks(self, piece: str) -> bool:
        """Whether a special token's text is part of a marker (so that it must be printed to be seen)."""
        return any(piece in m for m in (self.markers.open, self.markers.close, self.markers.answer_prefix) if m)

    def _skip_gap(self, buf: str) -> tuple[str, bool]:
        """After the close marker: drop blanks and the answer prefix. (rest, whether the gap is over)."""
        rest = buf.lstrip()
        prefix = self.markers.answer_prefix
        if prefix:
            if rest.startswith(prefix):
                rest = rest[len(prefix):]
            elif prefix.startswith(rest):
                return buf, False  # may still be the prefix
        if not rest:
            return "", False
        self._after_close = False
        return rest, True

    def flush(self) -> list[tuple[str, str]]:
        """End of the text: what was held back, as what it turned out to be."""
        rest, self._pending = self._pending, ""
        if not rest:
            return []
        if self.inside:
            return [("thinking", rest)]
        if self._after_close:
            rest = rest.lstrip()
            return [("answer", rest)] if rest else []
        return [("answer", rest)]


def _partial_suffix(buf: str, marker: str) -> int:
    """The length of the longest suffix of `buf` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0
