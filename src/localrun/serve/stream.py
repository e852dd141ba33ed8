"""One request path and one dialect-neutral answer stream for every HTTP dialect.

`Answer` answers a runtime Request on a resident model through runtime.generate (the request path `run` and
`chat` take: the prefix cache on disk, the slot held for the request, the state saved after), in a thread
of its own; the event loop reads its responses. `answer_events` turns them into events each dialect writes
in its own wire format: thinking, text (with its tokens' logprobs), tool calls (found in the model's own
format as the text streams, engine.tools.CallStream), a ping while nothing comes (a long prompt is still
being evaluated: clients that give up on a silent connection stay), and the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import LocalrunError, UsageError
from ..runtime import AnswerStream, Response, parser_for
from ..runtime.facts import facts_of
from ..runtime.generate import generate
from ..runtime.serving.scheduler import ServerStopping
from .errors import Refused, failure_text

FINISH_REASONS = {"stop": "stop", "eos": "stop", "length": "length"}  # how an answer that finished ends, as OpenAI says it
FAILURES = {"error": 500, "shutdown": 503}  # how an answer that did not finish ends; otherwise 499 (cancelled)
PING_S = float(os.environ.get("LOCALRUN_PING_S") or 10.0)  # a stream silent this long (a prompt still evaluated) gets a keep-alive


class ToLoop:
    """What a worker thread hands the event loop, in order: `put` on the thread (dropped once the loop has
    closed: nobody reads then), `queue` read in the loop. Made in the loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        self.put_all((item,))

    def put_all(self, items) -> None:
        """Several items at once: one wake-up of the loop."""
        def put() -> None:
            for item in items:
                self.queue.put_nowait(item)
        try:
            self.loop.call_soon_threadsafe(put)
        except RuntimeError:  # the loop closed: nobody reads
            pass


_live: set = set()  # answer threads still running: their state may still be going to disk
_open: "weakref.WeakSet[Answer]" = weakref.WeakSet()  # answers whose clients may still be reading (end_all)
_live_lock = threading.Lock()


def _tracked(work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        finally:
            with _live_lock:
                _live.discard(threading.current_thread())
    return run


def finish_answers(timeout: float) -> None:
    """Wait (up to `timeout` seconds in all) for answers still saving their state after their last token
    went out (the prefix cache written once the slot is given back), so that a server stopped right after
    a reply keeps what that reply stored."""
    deadline = time.monotonic() + timeout
    with _live_lock:
        threads = list(_live)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class Answer:
    """One request on a resident model, answered in its own thread by runtime.generate on the model's slots.
    `tools`: how the dialect reads tool calls in the answer (serve.prepare.ToolMode), or None.
    `on_end(final or None)` runs on that thread once the request is over (its state saved): the reference
    on the model is given back there."""

    def __init__(self, resident, request, *, tools=None, on_end: Callable[[Optional[Response]], None]):
        self.resident, self.request, self.tools = resident, request, tools
        self.on_end = on_end
        self.prompt = None  # runtime.request.Prompt, once admitted
        self.progress = None  # engine.Progress: how far the prompt's evaluation is (its cached part), as last heard
        self.piece_tokens: list[int] = []  # the tokens of the piece next_piece gave last
        self.failure_status: Optional[int] = None  # an answer that failed for the request's own fault: 400
        self.final: Optional[Response] = None  # its last response, once it is done
        self.gone = threading.Event()
        self._out = ToLoop()
        _open.add(self)
        # Set by collect(): nobody reads the answer before its end, so its responses go to the loop together then
        # (one wake-up of the event loop per answer, not one per step: on two cores that wake-up took CPU from
        # llama.cpp's threads at every token).
        self._whole = False

    def reader(self):
        """How this answer is read as it streams (runtime.AnswerStream), or None for plain text (a completion)."""
        if self.tools is not None:
            return self.tools.stream()
        request = self.request
        if request.raw or request.tokens is not None or not request.messages:
            return None
        template = facts_of(self.resident).chat_template
        if template is None:
            return None
        return AnswerStream(parser_for(template, reasoning=request.reasoning))

    def read_whole(self, text: str) -> tuple[str, list[dict]]:
        """(content, calls) of the whole answer, read in the model's family format."""
        if self.tools is not None:
            return self.tools.calls_in(text)
        reader = self.reader()
        return (text, []) if reader is None else (reader.parser.read(text).content, [])

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.tokens) if self.prompt is not None else 0

    async def start(self) -> None:
        """Start the request and wait until it is taken (its prompt fits, it has a slot or waits for one);
        raise what refused it (LocalrunError), the reference given back."""
        admitted = self._out.loop.create_future()

        def settle(outcome) -> None:
            if not admitted.done():
                admitted.set_result(outcome)

        thread = threading.Thread(target=_tracked(lambda: self._answer(settle)), name="localrun-answer", daemon=True)
        with _live_lock:
            _live.add(thread)
        thread.start()
        outcome = await admitted
        if isinstance(outcome, BaseException):
            raise outcome

    def _answer(self, settle: Callable[[Any], None]) -> None:
        """On the answer's own thread: the request answered, what it says handed to the loop; `settle` told once it
        is taken (None), or what refused it; `on_end` however it ends."""
        loop = self._out.loop

        def on_admitted(prompt) -> None:
            self.prompt = prompt
            loop.call_soon_threadsafe(settle, None)

        try:
            self._generate(on_admitted)
        except BaseException as exc:  # noqa: BLE001 - refused before it was taken, or failed on the way
            if self.prompt is None:
                loop.call_soon_threadsafe(settle, exc)
            else:
                if not isinstance(exc, LocalrunError):
                    traceback.print_exc()
                self.failure_status = 400 if isinstance(exc, UsageError) else None  # e.g. a grammar llama.cpp refuses
                self._out.put(_failed(exc))
        finally:
            try:
                self.on_end(self.final)
            finally:
                with contextlib.suppress(RuntimeError):  # (a loop already closed: nobody waits)
                    loop.call_soon_threadsafe(settle, LocalrunError("the request ended before it was taken"))

    def _generate(self, on_admitted) -> None:
        held: list[Response] = []
        try:
            for response in generate(self.resident.loaded, self.request, on_notice=_log, cancelled=self.gone.is_set,
                                     place=self.resident.scheduler, on_admitted=on_admitted):
                held.append(response)
                if response.done:
                    self.final = response
                elif self._whole:  # collect() reads nothing before the end
                    continue
                self._out.put_all(held)
                held = []
        finally:
            if held:
                self._out.put_all(held)

    def cancel(self) -> None:
        """The client went away: the answer stops at its next token (its slot freed)."""
        self.gone.set()

    async def next_piece(self) -> tuple[Response, str, str, list]:
        """The next response and whatever already waits behind it, as one: (the last response, the text, the
        thinking, the tokens' logprobs). One write per step instead of one per token. The prompt's last progress
        among them is kept in `progress`, their tokens in `piece_tokens`."""
        response: Response = await self._out.queue.get()
        text, thought, entries, tokens = response.text, response.thinking, list(response.logprobs or []), list(response.tokens)
        if response.progress is not None:
            self.progress = response.progress
        while not response.done and not self._out.queue.empty():
            more = self._out.queue.get_nowait()
            text += more.text
            thought += more.thinking
            entries += more.logprobs or []
            tokens += more.tokens
            if more.progress is not None:
                self.progress = more.progress
            if more.done:
                response = more
        self.piece_tokens = tokens
        return response, text, thought, entries

    async def collect(self) -> tuple[str, Response]:
        """The whole answer (not streamed) and its last response, which then carries every token's logprobs
        (when asked for), every token and the whole thinking. Refused (its status) when it did not finish."""
        self._whole = True
        parts, thought, logprobs, tokens = [], [], [], []
        while True:
            response, text, thinking, entries = await self.next_piece()
            parts.append(text)
            thought.append(thinking)
            logprobs += entries
            tokens += self.piece_tokens
            if response.done:
                break
        if response.finish_reason not in FINISH_REASONS:
            status = self.failure_status or FAILURES.get(response.finish_reason, 499)
            raise Refused(response.error or "the request was cancelled", status=status)
        if self.request.top_logprobs is not None:
            response.logprobs = logprobs
        response.thinking, response.tokens = "".join(thought), tokens
        return "".join(parts), response


def end_all(message: str) -> None:
    """Stopping at once (a second Ctrl-C): every open answer ends now with `message` (a stream's error event,
    a whole answer's 503), not when the scheduler's step under way would have let it."""
    for answer in list(_open):
        answer._out.put(Response(finish_reason="shutdown", error=message))


def _failed(exc: BaseException) -> Response:
    """The last response of an answer that failed on the way (llama.cpp's error, the server stopping)."""
    return Response(finish_reason="shutdown" if isinstance(exc, ServerStopping) else "error", error=failure_text(exc))


def _log(message: str) -> None:
    print(f"notice: {message}", file=sys.stderr, flush=True)


@dataclass
class Event:
    # "progress" (the prompt's evaluation: how far, its cached part), "thinking", "text", "call" (a tool call begins:
    # index, id, name; text: its arguments so far), "call_args"
    # (index; text: what its arguments grew by), "tool_calls" (the calls whole, once the answer is), "ping",
    # "done" (final set), "failed" (final set, error)
    kind: str
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    final: Optional[Response] = None
    logprobs: list = field(default_factory=list)  # the tokens of `text` (text held back comes later)
    index: int = 0
    name: str = ""
    id: str = ""
    progress: Any = None  # "progress": engine.Progress (the prompt's tokens, cached, processed)
    tokens: list[int] = field(default_factory=list)  # "text" of a plain completion: the tokens that made it ("done": those
    # whose text never came out, a stop word's)


async def answer_events(answer: Answer, ping_s: float = PING_S) -> AsyncIterator[Event]:
    """The answer as events, ending with "done" or "failed". The answer is read in its family's format as it
    streams (runtime.AnswerStream): text that may still be a tool call is held, but a call goes out as soon as
    its name is known and its arguments as they grow; nothing is ever silent for longer than `ping_s` (a ping
    while a long prompt is evaluated, or while text is held)."""
    reading = _Reading(answer)
    said = None  # the progress last given
    quiet_since = time.monotonic()
    while True:
        wait = max(0.0, ping_s - (time.monotonic() - quiet_since))
        try:
            response, text, thought, more = await asyncio.wait_for(answer.next_piece(), wait)
        except asyncio.TimeoutError:  # queue.get is cancelled before it takes anything: no piece is lost
            yield Event("ping")
            quiet_since = time.monotonic()
            continue
        ended_well = response.done and response.finish_reason in FINISH_REASONS
        if response.done and not ended_well:
            yield Event("failed", text=response.error or "the request was cancelled", final=response)
            return
        if answer.progress is not None and answer.progress is not said:  # (not written by every dialect: no silence reset)
            said = answer.progress
            yield Event("progress", progress=said)
        out = reading.events(text, thought, more, ended_well, getattr(answer, "piece_tokens", ()))
        for event in out:
            yield event
        if out:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= ping_s:  # tokens come, but all are held: still not silent
            yield Event("ping")
            quiet_since = time.monotonic()
        if response.done:  # (with the plain text's tokens whose text never came: a stop word's, cut)
            yield Event("done", final=response, tokens=reading.tokens)
            return


class _Reading:
    """An answer's text read as it comes: in its family's format (thinking, text, tool calls) where it has one, the
    tokens' logprobs going with the text they made."""

    def __init__(self, answer: Answer) -> None:
        self.reader, self.tools = answer.reader(), answer.tools
        self.entries: list = []  # logprobs of tokens whose text is not out yet
        self.tokens: list[int] = []  # plain text's tokens whose text is not out yet
        self.ids: dict[int, str] = {}  # a call's index -> its id

    def events(self, text: str, thought: str, logprobs: list, ended: bool, tokens: Sequence[int] = ()) -> list[Event]:
        """The events of one piece of the answer (`ended`: the last, which finished well); `tokens`: the piece's, which
        a plain text's event carries (llama-server's /completion writes them)."""
        self.entries += logprobs
        out: list[Event] = [Event("thinking", thought)] if thought else []
        if self.reader is None:
            self.tokens += tokens
            if text:
                out.append(self.text(text))
                out[-1].tokens, self.tokens = self.tokens, []
            return out
        for d in self.reader.feed(text) + (self.reader.finish() if ended else []):
            if d.reasoning:
                out.append(Event("thinking", d.reasoning))
            if d.content:
                out.append(self.text(d.content))
            if d.call_index is not None and self.tools is not None and (self.tools.parallel or d.call_index == 0):
                out += self.call(d)
        if ended and self.tools is not None:
            last = self.reader.last
            _, calls = self.tools.kept(last.content, [{**self.tools.call(c), "id": self.ids.get(i) or self.tools.new_id()}
                                                      for i, c in enumerate(last.calls)])
            out += [Event("tool_calls", calls=calls)] if calls else []
        return out

    def text(self, text: str) -> Event:
        event, self.entries = Event("text", text, logprobs=self.entries), []
        return event

    def call(self, d) -> list[Event]:
        """A call begins (its id and name, its arguments as far as they are written), or its arguments grow."""
        if d.call_index not in self.ids:
            self.ids[d.call_index] = d.id if d.id and not self.tools.nine_char_ids else self.tools.new_id()
            return [Event("call", d.arguments, index=d.call_index, name=d.name, id=self.ids[d.call_index])]
        return [Event("call_args", d.arguments, index=d.call_index)] if d.arguments else []
