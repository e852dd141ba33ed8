"""`localrun chat`: a multi-turn conversation with one model, its KV cache reused from turn to turn.

Behaviour a user (and a script) can rely on:

- Each turn's prompt is the previous turn's tokens (prompt, then the answer exactly as it was generated)
  followed by the tokens of what the template adds after them (the end of the answer, the new message,
  the assistant header), as llama.cpp's own llama-cli does. So only those new tokens are evaluated. If
  the template renders the history differently from the last prompt (or after /load, /system), the whole
  conversation is tokenised again and Engine.generate still reuses whatever prefix matches. The
  end-of-turn token the model sampled (ChatML's <|im_end|>) was never decoded, so it is evaluated as the
  first token of that glue; likewise the last token of an answer cut by --max-tokens.
- Ctrl-C stops the answer at the next token; what was shown stays in the conversation (an answer stopped
  before its first word is dropped together with its question). A second Ctrl-C interrupts at once (a long
  prompt evaluation): the KV cache is then cleared, so it never holds tokens the conversation does not.
- When the conversation no longer fits the context, the oldest turns after the system prompt are dropped,
  down to half the context so that it does not happen again on the next turn; always said on stderr.
- A model without a chat template (a base model) chats over a plain transcript ("User: ...\\nAssistant:"),
  each answer ending at the next "\\nUser:".
- stdin not a terminal: one message per line in, one answer per line out on stdout (newlines inside an
  answer written as \\n, backslashes as \\\\, surrounding blanks dropped; an empty line when a message
  fails); slash commands work too and print only on stderr, as do notices and stats.
- --session NAME: loaded at start when it exists (a session made by another model is refused, never
  overwritten), saved after every answer.
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .console import err, notice, render_error, warn
from .errors import ContextOverflow, LocalrunError, SessionError

if TYPE_CHECKING:
    from .engine import Engine, Stats
    from .runner import Loaded
    from .sampling import SamplingOptions

PLAIN_STOP = "\nUser:"


def render_messages(engine: "Engine", messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The model's chat template, or for a base model a plain transcript that PLAIN_STOP ends."""
    if engine.chat_template is not None:
        return engine.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    parts = []
    for m in messages:
        if m["role"] == "system":
            parts.append(m["content"] + "\n\n")
        elif m["role"] == "user":
            parts.append(f"User: {m['content']}\n")
        else:
            parts.append(f"Assistant: {m['content']}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)
PROMPT = ">>> "
CONTINUATION = "... "
BLOCK = '"""'

HELP = """\
/set PARAM VALUE   change a sampling option (/set alone lists them), e.g. /set temperature 0
/show              model, options, context used and left, session
/system TEXT       set the system prompt (/system alone shows it)
/clear             forget the conversation (the system prompt stays)
/save NAME         save the conversation (and its KV cache)
/load NAME         continue a saved conversation
/stats             timings of the last answer
/bye               exit (or Ctrl-D)

\"\"\" starts a multi-line message, ended by a line ending in \"\"\"; pasted text may span lines.
Ctrl-C stops an answer (what was shown stays in the conversation); a second Ctrl-C stops at once."""


@dataclass
class Turn:
    """What one exchange produced."""

    text: str
    stats: "Stats"
    interrupted: bool = False  # by Ctrl-C: `text` is what was shown


class Conversation:
    """The messages, and the tokens that the engine's KV cache mirrors for them."""

    def __init__(self, engine: "Engine", system: Optional[str]):
        self.engine = engine
        self.templated = engine.chat_template is not None
        self.messages: list[dict] = []
        # The tokens of the last prompt plus its answer, and the text they spell: the next prompt extends them.
        self._tokens: list[int] = []
        self._text = ""
        self.set_system(system)

    # -- the conversation --------------------------------------------------------------------

    @property
    def system(self) -> Optional[str]:
        if self.messages and self.messages[0]["role"] == "system":
            return self.messages[0]["content"]
        return None

    def set_system(self, text: Optional[str]) -> None:
        rest = [m for m in self.messages if m["role"] != "system"]
        self.messages = ([{"role": "system", "content": text}] if text else []) + rest
        self._forget_tokens()

    def clear(self) -> None:
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
        self._forget_tokens()  # the engine keeps its cache: the system prompt prefix is reused

    def replace(self, messages: list[dict]) -> None:
        self.messages = [dict(m) for m in messages]
        self._forget_tokens()

    def _forget_tokens(self) -> None:
        self._tokens, self._text = [], ""

    def reset_cache(self) -> None:
        """After an interruption inside llama.cpp: start from an empty KV cache rather than a doubtful one."""
        self.engine.reset()
        self._forget_tokens()

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    # -- prompt --------------------------------------------------------------------------------

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_messages(self.engine, messages, add_generation_prompt)

    def prompt(self, messages: list[dict]) -> tuple[list[int], str]:
        """The prompt tokens for `messages` and the text they spell."""
        full = self.render(messages)
        if self._tokens and full.startswith(self._text):
            new = self.engine.tokenize(full[len(self._text) :], add_special=False, parse_special=True)
            return self._tokens + new, full
        return self.engine.tokenize(full, add_special=True, parse_special=True), full

    def context_used(self) -> int:
        if not self.messages:
            return 0
        text = self.render(self.messages, add_generation_prompt=False)
        return len(self.engine.tokenize(text, add_special=True, parse_special=True))

    def fit(self, messages: list[dict], reserve: int) -> tuple[list[dict], list[int], str, int]:
        """Drop the oldest turns (after the system prompt) until the prompt leaves `reserve` tokens for
        the answer; once dropping, go on down to half the context so the next turn does not drop again."""
        n_ctx = self.engine.n_ctx
        tokens, full = self.prompt(messages)
        dropped = 0
        while len(tokens) + reserve > n_ctx or (dropped and len(tokens) > (n_ctx - reserve) // 2):
            first = next(i for i, m in enumerate(messages) if m["role"] != "system")
            if first >= len(messages) - 1:  # only the new message is left
                if len(tokens) + reserve <= n_ctx:
                    break
                raise ContextOverflow(
                    f"this message needs {len(tokens)} tokens with the conversation's template and"
                    f" {reserve} more are kept for the answer, but the context holds {n_ctx}:"
                    " shorten it, or restart with a larger --ctx"
                )
            end = first + 1
            while end < len(messages) - 1 and messages[end]["role"] != "user":
                end += 1
            messages = messages[:first] + messages[end:]
            dropped += 1
            tokens, full = self.prompt(messages)
        return messages, tokens, full, dropped

    # -- one exchange -----------------------------------------------------------------------------

    def send(
        self,
        text: str,
        sampling: "SamplingOptions",
        on_piece: Callable[[str], None],
        cancelled: Callable[[], bool] = lambda: False,
        on_dropped: Callable[[int], None] = lambda n: None,
    ) -> Turn:
        """Generate the answer to `text`, calling on_piece with each piece of it, and record the exchange.
        `cancelled` is polled between pieces; `on_dropped` hears how many old turns made room, first."""
        from .runner import Finished, Piece, stream_tokens

        if not self.templated:
            sampling = sampling.model_copy(update={"stop": [*sampling.stop, PLAIN_STOP]})
        reserve = sampling.max_tokens if sampling.max_tokens > 0 else self.engine.n_ctx // 4
        reserve = min(reserve, self.engine.n_ctx // 2)
        messages, tokens, full, dropped = self.fit([*self.messages, {"role": "user", "content": text}], reserve)
        if dropped:
            self.messages = messages[:-1]
            self._forget_tokens()
            on_dropped(dropped)
        shown: list[str] = []
        finished = None
        events = stream_tokens(self.engine, tokens, sampling)
        try:
            for event in events:
                if isinstance(event, Finished):
                    finished = event
                elif cancelled():
                    break
                elif isinstance(event, Piece):
                    shown.append(event.text)
                    on_piece(event.text)
        except KeyboardInterrupt:  # a second Ctrl-C: llama.cpp may have been stopped mid-call
            events.close()
            self.reset_cache()
            raise
        except LocalrunError:
            self._forget_tokens()
            raise
        finally:
            events.close()  # on Ctrl-C the engine's generator ends at a token boundary: its cache list stays exact
        answer = "".join(shown)
        if finished is None:  # stopped by Ctrl-C
            stats = replace(self.engine.last_stats, finish_reason="interrupted")
            if not answer:
                self._forget_tokens()
                return Turn("", stats, interrupted=True)
        else:
            stats = finished.stats
        ids = finished.tokens if finished is not None else []
        if not ids or self.engine.detokenize(ids) != answer:  # cut by a stop sequence or by Ctrl-C
            ids = self.engine.tokenize(answer, add_special=False, parse_special=True)
        content = answer if self.templated else answer.strip()
        self.messages = [*messages, {"role": "assistant", "content": content}]
        self._tokens, self._text = tokens + ids, full + answer
        return Turn(answer, stats, interrupted=finished is None)


# -- saving and loading ------------------------------------------------------------------------------

def save_conversation(name: str, conv: Conversation, model_ref: str) -> str:
    """Save messages and KV cache in the session store; return a one-line description."""
    from .sessions import SessionStore

    with SessionStore.open() as store:
        info = store.save(name, conv.engine, conv.messages, model_ref=model_ref)
    return f"saved session {name} ({conv.turns} turn(s), {info.tokens} tokens of KV cache)"


def session_exists(name: str) -> bool:
    """Whether `name` was saved (a bad name raises UsageError)."""
    from .sessions import SessionStore

    with SessionStore.open() as store:
        try:
            store.show(name)
        except SessionError:
            return False
    return True


def load_conversation(name: str, conv: Conversation, model_ref: str) -> str:
    from .sessions import SessionStore

    with SessionStore.open() as store:
        conv.replace(store.load(name, conv.engine))  # the store restores the KV cache too
    return f"loaded session {name} ({conv.turns} turn(s), {len(conv.engine.cached)} tokens cached)"


# -- the REPL ---------------------------------------------------------------------------------------


@contextmanager
def soft_interrupts() -> Iterator[Callable[[], bool]]:
    """While an answer streams, the first Ctrl-C only asks it to stop (at the next token, so the KV cache
    and its token list stay in step); a second one raises KeyboardInterrupt at once."""
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: presses > 0
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def quiet_typeahead() -> Iterator[None]:
    """While an answer streams, keys typed ahead are not echoed into it; the next prompt receives them."""
    try:
        import termios
    except ImportError:  # Windows
        yield
        return
    try:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError):  # not a terminal
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


class OneLineWriter:
    """An answer as one line: newlines escaped (\\n, backslashes as \\\\), surrounding blanks dropped."""

    def __init__(self, out):
        self.out = out
        self.started = False
        self.blank = ""  # trailing whitespace held back until more text follows

    def write(self, text: str) -> None:
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
        body = self.blank + text
        kept = body.rstrip()
        self.blank = body[len(kept) :]
        if kept:
            self.out.write(escape_line(kept))
            self.out.flush()

    def end(self) -> None:
        self.out.write("\n")
        self.out.flush()


def escape_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


class Chat:
    """The REPL: reads messages and slash commands, prints answers (stdout) and everything else (stderr)."""

    def __init__(self, loaded: "Loaded", *, system: Optional[str], session: Optional[str], verbose: bool, interactive: bool):
        self.loaded = loaded
        self.engine = loaded.engine
        self.sampling = loaded.sampling
        self.session = session
        self.verbose = verbose
        self.interactive = interactive
        self.system_flag = system
        self.conv = Conversation(loaded.engine, system if system is not None else loaded.system)
        self.last: Optional[Turn] = None
        self.commands: dict[str, Callable[[str], Optional[int]]] = {
            "help": self.cmd_help, "?": self.cmd_help, "set": self.cmd_set, "show": self.cmd_show,
            "system": self.cmd_system, "clear": self.cmd_clear, "save": self.cmd_save, "load": self.cmd_load,
            "stats": self.cmd_stats, "bye": self.cmd_bye, "exit": self.cmd_bye, "quit": self.cmd_bye,
        }

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> None:
        if not self.conv.templated:
            notice(
                f"{self.loaded.name} has no chat template (a base model): chatting over a plain transcript"
                " ('User: ...' / 'Assistant: ...'), each answer ending at the next 'User:'"
            )
        if self.session:
            if session_exists(self.session):
                notice(load_conversation(self.session, self.conv, self.loaded.name))
                if self.system_flag is not None and self.system_flag != self.conv.system:
                    self.conv.set_system(self.system_flag)  # --system overrides the saved one
            else:
                notice(f"new session {self.session}: saved after every answer")
        if self.interactive:
            err.print(
                f"[dim]{self.loaded.name} · context {self.engine.n_ctx} tokens · /help for commands,"
                " Ctrl-D or /bye to exit[/dim]",
                highlight=False,
            )

    # -- one line of input -----------------------------------------------------------------------

    def handle(self, line: str, *, message: bool = False) -> Optional[int]:
        """Run one message (`message`: even if it starts with a slash) or command; return an exit code to stop."""
        if line.startswith("/") and not message:
            name, _, rest = line[1:].partition(" ")
            command = self.commands.get(name.lower())
            if command is None:
                err.print(f"unknown command /{name}: /help lists them (start the line with a space to send it as a message)", markup=False)
                return None
            return command(rest.strip())
        text = line.strip()
        if text:
            self.answer(text)
        return None

    def answer(self, text: str) -> None:
        turn = self._to_terminal(text) if self.interactive else self._to_line(text)
        self.last = turn
        if turn.interrupted:
            what = "the partial answer stays in the conversation" if turn.text else "the message was dropped"
            err.print(f"[dim](interrupted: {what})[/dim]")
        if turn.stats.finish_reason == "length" and len(self.engine.cached) + 1 >= self.engine.n_ctx:
            warn(f"the answer filled the context ({self.engine.n_ctx} tokens) and was cut")
        if self.verbose:
            self.print_stats()
        if self.interactive:  # a blank line before the next prompt, where the prompt is
            spacer = sys.stdout if sys.stdout.isatty() else sys.stderr
            spacer.write("\n")
            spacer.flush()
        if self.session and not (turn.interrupted and not turn.text):
            try:
                save_conversation(self.session, self.conv, self.loaded.ref)
            except LocalrunError as exc:
                warn(f"could not save session {self.session}: {exc.message}")

    def _to_terminal(self, text: str) -> Turn:
        """Stream the answer as plain text, flushed per piece; Ctrl-C stops it."""
        out = sys.stdout
        at_line_start = True
        started = False

        def on_piece(piece: str) -> None:
            nonlocal at_line_start, started
            if not started:  # a transcript answer starts with the space after "Assistant:"
                piece = piece.lstrip()
                started = bool(piece)
                if not piece:
                    return
            out.write(piece)
            out.flush()
            at_line_start = piece.endswith("\n")

        try:
            with soft_interrupts() as cancelled, quiet_typeahead():
                return self.conv.send(text, self.sampling, on_piece, cancelled, self.dropped)
        finally:
            if not at_line_start:
                out.write("\n")
            out.flush()

    def _to_line(self, text: str) -> Turn:
        line = OneLineWriter(sys.stdout)
        try:
            return self.conv.send(text, self.sampling, line.write, on_dropped=self.dropped)
        finally:
            line.end()  # even after an error: a script reads one line per message

    def dropped(self, n: int) -> None:
        notice(
            f"the context ({self.engine.n_ctx} tokens) is full: dropped the oldest {n} turn(s) after the"
            " system prompt (the rest is read again)"
        )

    # -- commands ----------------------------------------------------------------------------------

    def cmd_help(self, _: str) -> None:
        err.print(HELP, markup=False, highlight=False)

    def cmd_bye(self, _: str) -> int:
        return 0

    def cmd_clear(self, _: str) -> None:
        self.conv.clear()
        err.print("cleared the conversation" + (" (the system prompt stays)" if self.conv.system else ""))

    def cmd_system(self, text: str) -> None:
        if not text:
            err.print(self.conv.system or "(no system prompt)", markup=False, highlight=False)
            return
        self.conv.set_system(text)
        err.print("system prompt set", markup=False)

    def cmd_set(self, args: str) -> None:
        from pydantic import ValidationError

        from .sampling import SamplingOptions

        fields = SamplingOptions.model_fields
        if not args:
            for name, f in fields.items():
                value = _short(getattr(self.sampling, name))
                err.print(f"{name:<18} {value:<12} {f.description or ''}", markup=False, highlight=False)
            return
        param, _, value = args.partition(" ")
        param, value = param.strip().lower().replace("-", "_"), value.strip()
        if param not in fields:
            err.print(f"unknown parameter {param!r}: one of {', '.join(fields)}", markup=False, highlight=False)
            return
        if not value:
            err.print(f"usage: /set {param} VALUE (now {getattr(self.sampling, param)!r})", markup=False, highlight=False)
            return
        try:
            merged = {**self.sampling.model_dump(), param: _set_value(param, value)}
            self.sampling = SamplingOptions.model_validate(merged)
        except ValidationError as exc:
            first = exc.errors()[0]
            err.print(f"invalid {param} {value!r}: {first['msg']}", markup=False, highlight=False)
            return
        except LocalrunError as exc:
            err.print(exc.message, markup=False, highlight=False)
            return
        except ValueError as exc:  # shlex: an unclosed quote
            err.print(f"invalid {param} {value!r}: {exc}", markup=False, highlight=False)
            return
        err.print(f"{param} = {_short(getattr(self.sampling, param))}", markup=False, highlight=False)

    def cmd_show(self, _: str) -> None:
        used = self.conv.context_used()
        n_ctx = self.engine.n_ctx
        defaults = type(self.sampling)()
        options = " ".join(
            f"{k}={_short(v)}" for k, v in self.sampling.model_dump().items()
            if v not in (None, [], {}) and (k in ("temperature", "top_k", "top_p", "min_p", "max_tokens", "seed") or v != getattr(defaults, k))
        )
        rows = [
            ("model", f"{self.loaded.name} ({self.engine.path})"),
            ("template", "the model's chat template" if self.conv.templated else "none: plain User:/Assistant: transcript"),
            ("system", self.conv.system or "(none)"),
            ("session", self.session or "(none: /save NAME to keep this conversation)"),
            ("conversation", f"{self.conv.turns} turn(s)"),
            ("context", f"{used} of {n_ctx} tokens used, {n_ctx - used} left ({len(self.engine.cached)} in the KV cache)"),
            ("options", options),
        ]
        for k, v in rows:
            err.print(f"{k + ':':<14}{v}", markup=False, highlight=False)

    def cmd_stats(self, _: str) -> None:
        if self.last is None:
            err.print("no answer yet", markup=False)
            return
        self.print_stats()

    def print_stats(self) -> None:
        from . import render

        render.stats(self.last.stats)
        used = self.conv.context_used()
        err.print(f"[dim]{'context:':<24}[/dim]{used} of {self.engine.n_ctx} tokens used", highlight=False)

    def cmd_save(self, name: str) -> None:
        if not name:
            err.print("usage: /save NAME", markup=False)
            return
        notice(save_conversation(name, self.conv, self.loaded.ref))

    def cmd_load(self, name: str) -> None:
        if not name:
            err.print("usage: /load NAME", markup=False)
            return
        notice(load_conversation(name, self.conv, self.loaded.name))
        self.last = None
        if self.session and self.session != name:
            # Answers were saved to the --session; from now on they extend the conversation just loaded,
            # so they go to it (saving them to the old name replaced that session with this one).
            self.session = name
            notice(f"answers are now saved to session {name}")


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _set_value(param: str, value: str):
    """Turn the text after `/set PARAM` into what SamplingOptions expects for that field."""
    from .sampling import parse_logit_bias, read_grammar, read_json_schema

    empty = value.lower() in ("none", "null", "off", "-")
    if param == "stop":
        return [] if empty else shlex.split(value)
    if param == "logit_bias":
        return {} if empty else parse_logit_bias(value.split())
    if param == "grammar":
        return None if empty else read_grammar(Path(value).expanduser())
    if param == "json_schema":
        return None if empty else read_json_schema(Path(value).expanduser())
    if param == "seed" and (empty or value.lower() == "random"):
        return None
    return value


# -- input ----------------------------------------------------------------------------------------------


def _open_block(text: str) -> bool:
    s = text.strip()
    return s.startswith(BLOCK) and not (len(s) >= 2 * len(BLOCK) and s.endswith(BLOCK))


def _unwrap_block(text: str) -> str:
    s = text.strip()
    if s.startswith(BLOCK):
        s = s[len(BLOCK) :]
        if s.endswith(BLOCK):
            s = s[: -len(BLOCK)]
        return s.strip()
    return text


def _prompt_session():
    from prompt_toolkit import PromptSession
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.output import create_output

    from .config import home

    path = home() / "chat_history"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = KeyBindings()

    @keys.add("c-c")
    def _interrupt(event):
        # Ctrl-C clears a line being typed; on an empty line it reaches the REPL (which prints a hint).
        if event.current_buffer.text:
            event.current_buffer.reset()
        else:
            event.app.exit(exception=KeyboardInterrupt(), style="class:aborting")

    session = PromptSession(
        history=FileHistory(str(path)),
        output=create_output(always_prefer_tty=True),  # answers may go to a file; the prompt stays on the terminal
        key_bindings=keys,
        prompt_continuation=CONTINUATION,
    )
    # Enter inserts a newline while a """ block is open; bracketed paste keeps pasted newlines.
    session.multiline = Condition(lambda: _open_block(session.default_buffer.text))
    return session


def _interactive(chat: Chat) -> int:
    session = _prompt_session()
    while True:
        try:
            line = session.prompt(PROMPT)
        except KeyboardInterrupt:
            err.print("[dim](Ctrl-D or /bye to exit)[/dim]")
            continue
        except EOFError:
            return 0
        block = line.lstrip().startswith(BLOCK)
        try:
            code = chat.handle(_unwrap_block(line) if block else line, message=block)
        except KeyboardInterrupt:  # a second Ctrl-C, or one during a command: llama.cpp may have been mid-call
            chat.conv.reset_cache()
            err.print("[dim](interrupted" + ("" if line.startswith("/") and not block else ": the message was dropped") + ")[/dim]")
            continue
        except LocalrunError as exc:
            render_error(exc)
            continue
        if code is not None:
            return code


def _piped(chat: Chat) -> int:
    lines = (raw.rstrip("\r\n") for raw in sys.stdin)
    for line in lines:
        block = line.lstrip().startswith(BLOCK)
        if block:  # a """ message runs to the line that closes it (or to the end of stdin), as typed
            while _open_block(line):
                more = next(lines, None)
                if more is None:
                    break
                line += "\n" + more
        try:
            code = chat.handle(_unwrap_block(line) if block else line, message=block)
        except LocalrunError as exc:  # one line on stderr (and an empty answer line on stdout); go on
            render_error(exc)
            continue
        if code is not None:
            return code
    return 0


def chat_loop(loaded: "Loaded", *, system: Optional[str], session: Optional[str], verbose: bool) -> int:
    """Run the chat until /bye, Ctrl-D or the end of stdin; return the exit code."""
    interactive = sys.stdin.isatty()
    chat = Chat(loaded, system=system, session=session, verbose=verbose, interactive=interactive)
    chat.start()
    return _interactive(chat) if interactive else _piped(chat)
