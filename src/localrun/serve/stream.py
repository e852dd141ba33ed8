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
import sys
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import LocalrunError, UsageError
from ..runtime import Response
from ..runtime.facts import facts_of
from .errors import ApiError
from .openai import FINISH_REASONS, PING_S

FAILURES = {"error": 500, "shutdown": 503}  # how an answer that did not finish ends; otherwise 499 (cancelled)


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
    `tools`: how the dialect reads tool calls in the answer (serve.openai.ToolMode), or None.
    `on_end(final or None)` runs on that thread once the request is over (its state saved): the reference
    on the model is given back there."""

    def __init__(self, resident, request, *, tools=None, on_end: Callable[[Optional[Response]], None]):
        self.resident, self.request, self.tools = resident, request, tools
        self.on_end = on_end
        self.prompt = None  # runtime.request.Prompt, once admitted
        self.progress = None  # engine.Progress: how far the prompt's evaluation is (its cached part), as last heard
        self.failure_status: Optional[int] = None  # an answer that failed for the request's own fault: 400
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
        from ..runtime import AnswerStream, parser_for

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

        def on_admitted(prompt) -> None:
            self.prompt = prompt
            self._out.loop.call_soon_threadsafe(settle, None)

        put, put_all = self._out.put, self._out.put_all

        def work() -> None:
            from ..runtime.generate import generate

            final, held = None, []
            try:
                for response in generate(self.resident.loaded, self.request, on_notice=_log, cancelled=self.gone.is_set,
                                         place=self.resident.scheduler, on_admitted=on_admitted):
                    held.append(response)
                    if response.done:
                        final = response
                    elif self._whole:  # collect() reads nothing before the end
                        continue
                    put_all(held)
                    held = []
            except BaseException as exc:  # noqa: BLE001 - refused before it was taken, or failed on the way
                if held:
                    put_all(held)
                if self.prompt is None:
                    self._out.loop.call_soon_threadsafe(settle, exc)
                else:
                    if not isinstance(exc, LocalrunError):
                        traceback.print_exc()
                    self.failure_status = 400 if isinstance(exc, UsageError) else None  # e.g. a grammar llama.cpp refuses
                    put(_failed(exc))
            finally:
                try:
                    self.on_end(final)
                finally:
                    with contextlib.suppress(RuntimeError):  # (a loop already closed: nobody waits)
                        self._out.loop.call_soon_threadsafe(settle, LocalrunError("the request ended before it was taken"))

        thread = threading.Thread(target=_tracked(work), name="localrun-answer", daemon=True)
        with _live_lock:
            _live.add(thread)
        thread.start()
        outcome = await admitted
        if isinstance(outcome, BaseException):
            raise outcome

    def cancel(self) -> None:
        """The client went away: the answer stops at its next token (its slot freed)."""
        self.gone.set()

    async def next_piece(self) -> tuple[Response, str, str, list]:
        """The next response and whatever already waits behind it, as one: (the last response, the text, the
        thinking, the tokens' logprobs). One write per step instead of one per token. The prompt's last progress
        among them is kept in `progress`."""
        response: Response = await self._out.queue.get()
        text, thought, entries = response.text, response.thinking, list(response.logprobs or [])
        if response.progress is not None:
            self.progress = response.progress
        while not response.done and not self._out.queue.empty():
            more = self._out.queue.get_nowait()
            text += more.text
            thought += more.thinking
            entries += more.logprobs or []
            if more.progress is not None:
                self.progress = more.progress
            if more.done:
                response = more
        return response, text, thought, entries

    async def collect(self) -> tuple[str, Response]:
        """The whole answer (not streamed) and its last response, which then carries every token's logprobs
        (when asked for) and the whole thinking. ApiError when it did not finish."""
        self._whole = True
        parts, thought, logprobs = [], [], []
        while True:
            response, text, thinking, entries = await self.next_piece()
            parts.append(text)
            thought.append(thinking)
            logprobs += entries
            if response.done:
                break
        if response.finish_reason not in FINISH_REASONS:
            status = self.failure_status or FAILURES.get(response.finish_reason, 499)
            raise ApiError(status, response.error or "the request was cancelled",
                           type_="invalid_request_error" if status == 400 else "server_error")
        if self.request.top_logprobs is not None:
            response.logprobs = logprobs
        response.thinking = "".join(thought)
        return "".join(parts), response


def end_all(message: str) -> None:
    """Stopping at once (a second Ctrl-C): every open answer ends now with `message` (a stream's error event,
    a whole answer's 503), not when the scheduler's step under way would have let it."""
    for answer in list(_open):
        answer._out.put(Response(finish_reason="shutdown", error=message))


def _failed(exc: BaseException) -> Response:
    """The last response of an answer that failed on the way (llama.cpp's error, the server stopping)."""
    from ..runtime.failures import message_for
    from ..runtime.scheduler import ServerStopping

    if isinstance(exc, ServerStopping):  # worded for an HTTP client (the command line's says how to start one again)
        return Response(finish_reason="shutdown", error=exc.failure or STOPPING)
    return Response(finish_reason="error", error=message_for(exc)[0])


STOPPING = "the server is shutting down: retry later"


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


async def answer_events(answer: Answer, ping_s: float = PING_S) -> AsyncIterator[Event]:
    """The answer as events, ending with "done" or "failed". The answer is read in its family's format as it
    streams (runtime.AnswerStream): text that may still be a tool call is held, but a call goes out as soon as
    its name is known and its arguments as they grow; nothing is ever silent for longer than `ping_s` (a ping
    while a long prompt is evaluated, or while text is held)."""
    reader = answer.reader()
    tools = answer.tools
    entries: list = []
    ids: dict[int, str] = {}
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
        entries += more
        ended_well = response.done and response.finish_reason in FINISH_REASONS
        if response.done and not ended_well:
            yield Event("failed", text=response.error or "the request was cancelled", final=response)
            return
        if answer.progress is not None and answer.progress is not said:  # (not written by every dialect: no silence reset)
            said = answer.progress
            yield Event("progress", progress=said)
        out: list[Event] = []
        if thought:
            out.append(Event("thinking", thought))
        if reader is None:
            if text:
                out.append(Event("text", text, logprobs=entries))
                entries = []
        else:
            found = reader.feed(text) + (reader.finish() if ended_well else [])
            for d in found:
                if d.reasoning:
                    out.append(Event("thinking", d.reasoning))
                if d.content:
                    out.append(Event("text", d.content, logprobs=entries))
                    entries = []
                if d.call_index is not None and tools is not None and (tools.parallel or d.call_index == 0):
                    if d.call_index not in ids:
                        ids[d.call_index] = d.id if d.id and not tools.nine_char_ids else tools.new_id()
                        out.append(Event("call", d.arguments, index=d.call_index, name=d.name, id=ids[d.call_index]))
                    elif d.arguments:
                        out.append(Event("call_args", d.arguments, index=d.call_index))
        if ended_well and tools is not None:
            content, calls = tools._kept(reader.last.content, [{**tools.call(c), "id": ids.get(i) or tools.new_id()}
                                                              for i, c in enumerate(reader.last.calls)])
            if calls:
                out.append(Event("tool_calls", calls=calls))
        for event in out:
            yield event
        if out:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= ping_s:  # tokens come, but all are held: still not silent
            yield Event("ping")
            quiet_since = time.monotonic()
        if response.done:
            yield Event("done", final=response)
            return


# -- what the translators (anthropic.py, responses.py) share --------------------------------------------


def need(cond: bool, message: str, param: Optional[str] = None) -> None:
    """A 400 naming what is wrong with the body, unless `cond`."""
    if not cond:
        raise ApiError(400, message, param=param)


def function_tools(tools: Any, runs_here, schema_key: str) -> list[dict]:
    """A dialect's tools as OpenAI function tools: those `runs_here(tool)` says are the client's own
    functions; the rest (web_search and other tools the dialect's own service runs) are left out, as
    nothing here can run them."""
    if tools is None:
        return []
    need(isinstance(tools, list), "tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        need(isinstance(t, dict), f"tools.{i} must be an object", "tools")
        if not runs_here(t):
            continue
        need(isinstance(t.get("name"), str) and t["name"], f"tools.{i}.name must be a non-empty string", "tools")
        schema = t.get(schema_key) or {"type": "object", "properties": {}}
        need(isinstance(schema, dict), f"tools.{i}.{schema_key} must be a JSON schema object", "tools")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description") or "", "parameters": schema}})
    return out
