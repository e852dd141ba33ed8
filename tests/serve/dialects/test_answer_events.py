"""The one answer stream every dialect writes (serve.stream.answer_events), from canned pieces of an answer: text as
it comes, a tool call in the model's own format read as it is written (its name first, its arguments as they
grow), thinking apart, a failure, the prompt's progress, and a ping while nothing can be said."""

from __future__ import annotations

import asyncio
from typing import Optional

from dialect_fakes import FakeFacts, final

from localrun.engine.types import Response
from localrun.runtime import AnswerStream, parser_for
from localrun.serve.asked import Asked, Message, Tool
from localrun.serve.prepare import prepared
from localrun.serve.stream import answer_events

ADD = Tool({"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}})


class CannedAnswer:
    """What serve.stream.Answer gives answer_events, canned: pieces of text, or (text, thinking) as the request path
    splits a reasoning model's thinking off (a number: seconds of silence first), then its last response."""

    def __init__(self, pieces: list, last: Response, tools=None, template: Optional[str] = None, progress=None):
        self.pieces, self.last, self.tools, self.template, self.progress = list(pieces), last, tools, template, None
        self.coming_progress = progress

    def reader(self):
        if self.tools is not None:
            return self.tools.stream()
        return AnswerStream(parser_for(self.template)) if self.template else None

    async def next_piece(self):
        if self.coming_progress is not None:
            self.progress, self.coming_progress = self.coming_progress, None
        if not self.pieces:
            return self.last, "", "", []
        piece = self.pieces.pop(0)
        if isinstance(piece, float):
            await asyncio.sleep(piece)
            piece = self.pieces.pop(0)
        text, thinking = piece if isinstance(piece, tuple) else (piece, "")
        return Response(text=text, thinking=thinking), text, thinking, []


def events(answer: CannedAnswer, ping_s: float = 10.0) -> list:
    async def read():
        return [e async for e in answer_events(answer, ping_s=ping_s)]
    return asyncio.run(read())


def test_text_as_it_comes_then_done():
    out = events(CannedAnswer(["Hel", "lo"], final("stop")))
    assert [(e.kind, e.text) for e in out] == [("text", "Hel"), ("text", "lo"), ("done", "")] and out[-1].final.finish_reason == "stop"


def test_a_call_in_the_models_own_format_goes_out_as_it_is_written():
    _, tools = prepared(Asked(messages=[Message("user", "Add")], tools=[ADD]), FakeFacts())  # Qwen 2.5's <tool_call> tags
    out = events(CannedAnswer(['<tool_call>\n{"name": "add", ', '"arguments": {"a": ', '1}}\n</tool_call>'], final("stop"), tools=tools))
    kinds = [e.kind for e in out]
    assert kinds[0] == "call" and out[0].name == "add" and kinds[-2:] == ["tool_calls", "done"]
    assert out[0].text + "".join(e.text for e in out if e.kind == "call_args") == '{"a": 1}'
    [call] = out[-2].calls
    assert (call["name"], call["arguments"], call["id"]) == ("add", {"a": 1}, out[0].id) and "text" not in kinds


def test_thinking_is_apart_from_the_text():
    out = events(CannedAnswer([("", "Hm, "), ("", "easy."), "Four."], final("stop"), template=FakeFacts("Qwen-Qwen3-0.6B").chat_template))
    assert "".join(e.text for e in out if e.kind == "thinking") == "Hm, easy."
    assert "".join(e.text for e in out if e.kind == "text") == "Four."


def test_an_answer_that_fails_ends_failed():
    out = events(CannedAnswer(["a"], Response(finish_reason="error", error="llama.cpp failed")))
    assert [e.kind for e in out] == ["text", "failed"] and out[-1].text == "llama.cpp failed"


def test_the_prompts_progress_and_a_ping_while_nothing_comes():
    progress = type("Progress", (), {"total": 9, "cached": 3, "processed": 9})()
    out = events(CannedAnswer([0.5, "Hi"], final("stop"), progress=progress), ping_s=0.05)
    kinds = [e.kind for e in out]
    assert kinds[0] == "ping" and "progress" in kinds and kinds[-2:] == ["text", "done"]
    assert next(e for e in out if e.kind == "progress").progress.cached == 3
