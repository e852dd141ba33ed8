"""Reasoning models' thinking, kept apart from the answer: the markers a family writes it between, whether the
prompt already opened the block, and the splitter that turns streamed text into thinking and answer pieces (a
marker split across tokens is still found; text that may be the start of one is held back, as the stop matcher
holds back a possible stop). Which family writes which markers is in engine.formats' table.

(engine.thinking gives these names, and markers_for and thinking_in, where the rest of localrun reads them.)

Examples of markers:
  <think> ... </think>   DeepSeek-R1 distills, Qwen3, QwQ, GLM, Kimi K2 Thinking, MiniMax M2, SmolLM3 and most
                          others; a template may open the block itself at the end of the prompt ("<think>\\n")
  gpt-oss                <|channel|>analysis<|message|> ... <|end|>, the answer after
                          <|start|>assistant<|channel|>final<|message|>
  [THINK] ... [/THINK] (Ministral 3 Reasoning), <|START_THINKING|> ... <|END_THINKING|> (Command R7B),
  <seed:think> ... </seed:think> (Seed-OSS), <|channel>thought ... <channel|> (Gemma 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Markers:
    open: str
    close: str
    answer_prefix: str = ""  # text between the end of the thinking and the answer, dropped (gpt-oss)
    closes: tuple[str, ...] = ()  # other texts that close it as `close` does (dropped)
    ends: tuple[str, ...] = ()  # what the answer may begin with, ending an unclosed thinking (a tool call's marker: kept)
    # stray markers a model writes before its thinking or answer begins (gpt-oss's "<|channel|>commentary
    # to=assistant", Gemma 4's empty "<|channel>"): dropped there
    strays: tuple[str, ...] = ()


THINK = Markers("<think>", "</think>")
GPT_OSS = Markers("<|channel|>analysis<|message|>", "<|end|>", "<|start|>assistant<|channel|>final<|message|>")


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
    return grammar is None or any(m in grammar for m in (markers.close, *markers.closes, *markers.ends) if m)


def splitter_for(thinking: Optional[tuple], sampling=None) -> Optional["ThinkingSplitter"]:
    """A fresh splitter for the answer to a prompt whose thinking is `thinking`: (markers or None, whether the
    prompt opened the block[, the special tokens the output must show]), sampled with `sampling`."""
    if thinking is None:
        return None
    markers, opened, *rest = thinking
    preserved = rest[0] if rest else ()
    if markers is None and not preserved:
        return None
    splitter = ThinkingSplitter(markers, preserved=preserved)
    if isinstance(opened, str):  # the prompt's tail (formats.prompt_tail): the splitter goes on from there
        if markers is None or opens_for(markers, True, sampling):
            splitter.feed(opened)
    elif markers is not None:
        splitter.inside = splitter.thought = opens_for(markers, opened, sampling) or markers.open == ""
    budget = getattr(sampling, "reasoning_budget", None)
    if markers is not None and budget is not None and budget >= 0:
        splitter.budget = budget
    return splitter


def has_switch(template: Optional[str]) -> bool:
    """Whether the template can turn thinking on and off (Qwen3's `enable_thinking`)."""
    return "enable_thinking" in (template or "")


class ThinkingSplitter:
    """Feed decoded text; get back [(kind, text)] with kind "thinking" or "answer". Markers never appear in
    the output; blanks at the thinking's start and end, and right after it (before the answer), are dropped.
    Without markers (a family that does not think, or thinking asked inline) all is answer: the splitter then
    only says which special tokens the output must show (`preserved`: a family's tool-call markers)."""

    def __init__(self, markers: Optional[Markers], *, inside: bool = False, preserved: tuple[str, ...] = ()):
        self.markers = markers
        self.preserved = frozenset(preserved)
        # in the thinking now (a family whose thinking has no open marker thinks from the turn's start: Apriel)
        self.inside = markers is not None and (inside or markers.open == "")
        self.budget: Optional[int] = None  # most tokens of thinking (a request's reasoning_budget): then it is closed
        self.thought = self.inside  # a thinking block has been seen
        self._pending = ""
        self._blank = ""  # blanks inside the thinking, held until more thinking follows them
        self._started = False  # the thinking has had a non-blank character
        self._after_close = False  # just left the thinking: drop the blank (and the answer prefix) before the answer
        self._answered = False
        if markers is not None:
            self._closes = (markers.close, *markers.closes)
            self._ends = markers.ends

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.markers is None:
            return [("answer", text)] if text else []
        out: list[tuple[str, str]] = []
        buf = self._pending + text
        self._pending = ""
        while buf:
            if self.inside:
                at, marker, kept = self._end_of_thinking(buf)
                if at >= 0:
                    self._think(out, buf[:at])
                    buf = buf[at:] if kept else buf[at + len(marker):]
                    self.inside, self._after_close = False, not kept
                    self._blank = ""
                    continue
                keep = max((_partial_suffix(buf, m) for m in (*self._closes, *self._ends)), default=0)
                self._think(out, buf[: len(buf) - keep])
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
                if self.markers.open and stripped.startswith(self.markers.open):
                    buf = stripped[len(self.markers.open):]
                    self.inside = self.thought = True
                    continue
                if self.markers.open and self.markers.open.startswith(stripped):
                    self._pending = buf  # may still become the open marker
                    break
                # a close with no open (the template closed an empty block: thinking off), or a stray marker: dropped
                gone = next((m for m in (*self._closes, *self.markers.strays) if m and stripped.startswith(m)), None)
                if gone is not None:
                    buf = stripped[len(gone):]
                    self._after_close = gone in self._closes
                    continue
                if any(m.startswith(stripped) for m in (self.markers.open, *self._closes, *self.markers.strays) if m):
                    self._pending = buf  # may still become a marker
                    break
            out.append(("answer", buf))
            self._answered = self._answered or bool(buf.strip())
            break
        return [(kind, t) for kind, t in out if t]

    def _end_of_thinking(self, buf: str) -> tuple[int, str, bool]:
        """Where the thinking ends in buf: (index, the marker, whether the marker is the answer's own: kept)."""
        best = (-1, "", False)
        for marker, kept in [*((m, False) for m in self._closes), *((m, True) for m in self._ends)]:
            i = buf.find(marker)
            if i >= 0 and (best[0] < 0 or i < best[0]):
                best = (i, marker, kept)
        return best

    def _think(self, out: list, text: str) -> None:
        """Thinking text, without its leading blanks; trailing blanks held until more thinking follows."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        body = text.rstrip()
        if body:
            out.append(("thinking", self._blank + body))
            self._blank = text[len(body):]
        else:
            self._blank += text

    def closing(self) -> str:
        """The text that closes the thinking when its budget is spent (the family's own end marker)."""
        return self.markers.close

    def marks(self, piece: str) -> bool:
        """Whether a special token's text is part of a marker (so that it must be printed to be seen)."""
        if piece in self.preserved:
            return True
        m = self.markers
        return m is not None and any(piece in x for x in (m.open, *self._closes, *m.ends, m.answer_prefix) if x)

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
            out: list = []
            self._think(out, rest)
            return out
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
