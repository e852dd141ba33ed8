"""`localrun chat`: the REPL over a runtime Conversation (one model, its KV cache reused from turn to turn).

Behaviour a user (and a script) can rely on:

- Each turn evaluates only what is new since the last one (see runtime/conversation.py). The end-of-turn
  token the model sampled (ChatML's <|im_end|>) was never decoded, so it is evaluated as the first token of
  the next prompt's new part; likewise the last token of an answer cut by --max-tokens.
- Ctrl-C stops the answer at the next token; what was shown stays in the conversation (an answer stopped
  before its first word is dropped together with its question). A second Ctrl-C interrupts at once (a long
  prompt evaluation): the KV cache is then cleared, so it never holds tokens the conversation does not.
- When the conversation no longer leaves the answer its room, the oldest turns after the system prompt are
  dropped, in a block of at least half that room so that the next turns do not drop again (the one policy of
  the request path, runtime.request._drop_oldest); always said on stderr.
- A model without a chat template (a base model) chats over a plain transcript ("User: ...\\nAssistant:"),
  each answer ending at the next "\\nUser:".
- stdin not a terminal: one message per line in, one answer per line out on stdout (newlines inside an
  answer written as \\n, backslashes as \\\\, surrounding blanks dropped; an empty line when a message
  fails); slash commands work too and print only on stderr, as do notices and stats.
- --session NAME: loaded at start when it exists (a session made by another model is refused, never
  overwritten), saved after every answer.
- Images (a vision model, chat --mmproj): `/image PATH` attaches a file to the next message (repeat for more),
  `/image` lists what is attached, `/image clear` drops it; a message naming an existing image file (quoted or
  not, spaces escaped with a backslash as a terminal drops a file, .png .jpg .jpeg .gif .bmp .webp) attaches
  it and leaves its path out of the text, as Ollama's REPL does. The images go with that message, before its
  text, and stay in the conversation (their KV is reused, not encoded again) and in its session. A message
  takes what is attached with it, answered or not: a bad image fails it in one line naming the image.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..console import err, notice, warn
from ..errors import LocalrunError, SessionError
from ..runtime.failures import flag
from ..runtime.options import OLLAMA_LOAD, OLLAMA_RENAMED, ollama_name
from .render import PromptProgress, ThinkingWriter, render_error

if TYPE_CHECKING:
    from ..runtime import Response
    from ..runtime.conversation import Conversation

PROMPT = ">>> "
CONTINUATION = "... "
BLOCK = '"""'

HELP = """\
/set PARAM VALUE   change a sampling option (/set alone lists them), e.g. /set temperature 0
                   (Ollama's /set parameter NAME VALUE, /set system TEXT, /set verbose|quiet work too)
/show              model, options, context used and left, session (/show template|system|parameters)
/system TEXT       set the system prompt (/system alone shows it)
/image PATH        attach an image to the next message (repeat for more; /image alone lists them, /image clear
                   drops them); a message naming an image file attaches it too
/clear             forget the conversation (the system prompt stays)
/save NAME         save the conversation (and its KV cache)
/load NAME         continue a saved conversation
/stats             timings of the last answer
/bye               exit (or Ctrl-D)

\"\"\" starts a multi-line message, ended by a line ending in \"\"\"; pasted text may span lines.
Ctrl-C stops an answer (what was shown stays in the conversation); a second Ctrl-C stops at once."""


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


def session_exists(name: str) -> bool:
    """Whether `name` was saved (a bad name raises UsageError)."""
    from ..store.sessions import SessionStore

    with SessionStore.open() as store:
        try:
            store.show(name)
        except SessionError:
            return False
    return True


class Chat:
    """The REPL: reads messages and slash commands, prints answers (stdout) and everything else (stderr).
    `conv` is a runtime Conversation in this process, or a RemoteConversation kept by the resident server:
    the two answer alike."""

    def __init__(self, conv: "Conversation", *, system: Optional[str], session: Optional[str], verbose: bool, interactive: bool):
        self.conv = conv
        self.sampling = conv.sampling
        self.session = session
        self.verbose = verbose
        self.interactive = interactive
        self.system_flag = system
        conv.set_system(system if system is not None else conv.default_system)
        conv.clear()  # a new conversation: the model's preset messages (a Modelfile's MESSAGEs) first
        self.last: Optional["Response"] = None  # the last answer's final response (its stats)
        self._sees_images: Optional[bool] = None
        self.attached: list = []  # images (engine.vision.Image, read by runtime.images) for the next message
        self.commands: dict[str, Callable[[str], Optional[int]]] = {
            "help": self.cmd_help, "?": self.cmd_help, "set": self.cmd_set, "show": self.cmd_show,
            "system": self.cmd_system, "clear": self.cmd_clear, "save": self.cmd_save, "load": self.cmd_load,
            "stats": self.cmd_stats, "image": self.cmd_image, "bye": self.cmd_bye, "exit": self.cmd_bye, "quit": self.cmd_bye,
        }

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> None:
        if not self.conv.templated:
            notice(
                f"{self.conv.name} has no chat template (a base model): chatting over a plain transcript"
                " ('User: ...' / 'Assistant: ...'), each answer ending at the next 'User:'"
            )
        if self.session:
            self.conv.hold_session(self.session)  # refused here while another chat has it (store.writers)
            if session_exists(self.session):
                notice(self.conv.load(self.session))
                if self.system_flag is not None and self.system_flag != self.conv.system:
                    self.conv.set_system(self.system_flag)  # --system overrides the saved one
            else:
                notice(f"new session {self.session}: saved after every answer")
        if self.interactive:
            err.print(
                f"[dim]{self.conv.name} · context {self.conv.n_ctx} tokens · /help for commands,"
                " Ctrl-D or /bye to exit[/dim]",
                highlight=False,
            )

    # -- one line of input -----------------------------------------------------------------------

    def handle(self, line: str, *, message: bool = False) -> Optional[int]:
        """Run one message (`message`: even if it starts with a slash) or command; return an exit code to stop."""
        if line.startswith("/") and not message:
            name, _, rest = line[1:].partition(" ")
            command = self.commands.get(name.lower())
            if command is None and _starts_with_image(line):  # a dropped file's path, as Ollama's REPL takes it
                return self.handle(line, message=True)
            if command is None:
                err.print(f"unknown command /{name}: /help lists them (start the line with a space to send it as a message)", markup=False)
                return None
            return command(rest.strip())
        text = line.strip()
        if text or self.attached:
            self.answer(text)
        return None

    def answer(self, text: str) -> None:
        images, self.attached = self.attached, []  # the message takes them, answered or not
        answer, final = self._to_terminal(text, images) if self.interactive else self._to_line(text, images)
        self.last = final
        interrupted = final.finish_reason == "interrupted"
        if interrupted:
            what = "the partial answer stays in the conversation" if answer else "the message was dropped"
            err.print(f"[dim](interrupted: {what})[/dim]")
        if final.finish_reason == "length" and self.conv.kv_tokens + 1 >= self.conv.n_ctx:
            warn(f"the answer filled the context ({self.conv.n_ctx} tokens) and was cut")
        if self.verbose:
            self.print_stats()
        if self.interactive:  # a blank line before the next prompt, where the prompt is
            spacer = sys.stdout if sys.stdout.isatty() else sys.stderr
            spacer.write("\n")
            spacer.flush()

    def _to_terminal(self, text: str, images: list) -> tuple[str, "Response"]:
        """Stream the answer as plain text, flushed per piece; Ctrl-C stops it."""
        out = sys.stdout
        at_line_start = True
        started = False
        thinking = ThinkingWriter()  # a reasoning model's thinking: dimmed, on stderr, before the answer
        progress = PromptProgress()  # a long prompt's evaluation: one line on stderr, erased as the answer begins

        def on_thinking(text: str) -> None:
            progress.end()
            thinking.write(text)

        def on_piece(piece: str) -> None:
            nonlocal at_line_start, started
            if not started:  # a transcript answer starts with the space after "Assistant:"
                piece = piece.lstrip()
                started = bool(piece)
                if not piece:
                    return
            progress.end()
            thinking.end()
            out.write(piece)
            out.flush()
            at_line_start = piece.endswith("\n")

        try:
            text, images = self.dropped_images(text, images)
            with soft_interrupts() as cancelled, quiet_typeahead():
                return self.conv.send(text, self.sampling, on_piece, cancelled, self.dropped, save_as=self.session,
                                      on_save_failed=warn, on_thinking=on_thinking, on_progress=progress.show, **_with(images))
        finally:
            progress.end()
            thinking.end()
            if not at_line_start:
                out.write("\n")
            out.flush()

    def _to_line(self, text: str, images: list) -> tuple[str, "Response"]:
        line = OneLineWriter(sys.stdout)
        thinking = ThinkingWriter()
        try:
            text, images = self.dropped_images(text, images)
            return self.conv.send(text, self.sampling, line.write, on_dropped=self.dropped, save_as=self.session,
                                  on_save_failed=warn, on_thinking=thinking.write, **_with(images))
        finally:
            thinking.end()
            line.end()  # even after an error: a script reads one line per message

    def dropped_images(self, text: str, images: list) -> tuple[str, list]:
        """The message's text without the image files it names, and `images` followed by theirs; for a model that
        takes no images, the text as typed (Ollama's REPL reads file names as images only for a multimodal one)."""
        if not self.sees_images():
            return text, images
        text, paths = image_paths_in(text)
        if not paths:
            return text, images
        found = read_image_files(paths)
        for image in found:
            err.print(f"added image {image.name}", markup=False, highlight=False)
        return text, [*images, *found]

    def sees_images(self) -> bool:
        """Whether the chat's model takes images: a projector given (--mmproj) or loaded, or one beside its file."""
        if self._sees_images is None:
            from ..runtime.images import projector_beside

            conv = self.conv
            seen = getattr(conv, "mmproj", None) is not None or getattr(getattr(conv, "engine", None), "vision", None) is not None
            if not seen:
                try:
                    seen = projector_beside([Path(conv.model_path)]) is not None
                except LocalrunError:  # several beside it: an image names which is missing (--mmproj)
                    seen = True
            self._sees_images = seen
        return self._sees_images

    def dropped(self, n: int) -> None:
        notice(
            f"the context ({self.conv.n_ctx} tokens) is full: dropped the oldest {n} turn(s) after the"
            " system prompt (the rest is read again)"
        )

    # -- commands ----------------------------------------------------------------------------------

    def cmd_help(self, _: str) -> None:
        err.print(HELP, markup=False, highlight=False)

    def cmd_bye(self, _: str) -> int:
        return 0

    def cmd_clear(self, _: str) -> None:
        self.conv.clear()
        self.last = None  # /stats no longer speaks of an answer that is gone
        err.print("cleared the conversation" + (" (the system prompt stays)" if self.conv.system else "")
                  + (f" (the model's {len(self.conv.preset)} first messages stay)" if self.conv.preset else ""))

    def cmd_system(self, text: str) -> None:
        if not text:
            err.print(self.conv.system or "(no system prompt)", markup=False, highlight=False)
            return
        self.conv.set_system(text)
        err.print("system prompt set", markup=False)

    def cmd_set(self, args: str) -> None:
        word, _, rest = args.partition(" ")
        ollama = _OLLAMA_SET.get(word.lower())
        if ollama is not None:  # Ollama's REPL spelling
            return ollama(self, rest.strip())
        self.set_option(args)

    def set_option(self, args: str) -> None:
        """/set NAME VALUE (Ollama's /set parameter NAME VALUE); alone, the list."""
        from ..runtime.options import OptionError, SamplingOptions, merge_options, text_value

        fields = SamplingOptions.model_fields
        if not args:
            for name, f in fields.items():
                value = _short(getattr(self.sampling, name))
                err.print(f"{name:<18} {value:<12} {f.description or ''}", markup=False, highlight=False)
            return
        param, _, value = args.partition(" ")
        param, value = param.strip().lower().replace("-", "_"), value.strip()
        param = OLLAMA_RENAMED.get(param, param)
        if param in OLLAMA_LOAD:
            err.print(f"{param} is fixed when the model loads: restart the chat with {flag(OLLAMA_LOAD[param])}",
                      markup=False, highlight=False)
            return
        if param not in fields:
            err.print(f"unknown parameter {param!r}: one of {', '.join(fields)}", markup=False, highlight=False)
            return
        if not value:
            err.print(f"usage: /set {param} VALUE (now {getattr(self.sampling, param)!r})", markup=False, highlight=False)
            return
        try:
            self.sampling = merge_options(self.sampling.model_dump(exclude={param}), {param: text_value(param, value)})
        except OptionError as exc:
            message = exc.reason if exc.field is None else f"invalid {param} {value!r}: {exc.reason}"
            err.print(message, markup=False, highlight=False)
            return
        except LocalrunError as exc:
            err.print(exc.message, markup=False, highlight=False)
            return
        except ValueError as exc:  # shlex: an unclosed quote
            err.print(f"invalid {param} {value!r}: {exc}", markup=False, highlight=False)
            return
        err.print(f"{param} = {_short(getattr(self.sampling, param))}", markup=False, highlight=False)

    def set_verbose(self, on: bool) -> None:
        self.verbose = on
        err.print("timing stats after each answer" if on else "no timing stats", markup=False)

    def cmd_show(self, what: str) -> None:
        """/show: the model, options, context and session; Ollama's /show info|template|system|parameters."""
        what = what.strip().lower()
        if what == "system":
            err.print(self.conv.system or "(no system prompt)", markup=False, highlight=False)
            return
        if what == "template":
            err.print(self._template() or "(none: a plain User:/Assistant: transcript)", markup=False, highlight=False)
            return
        if what == "parameters":
            defaults = type(self.sampling)()
            changed = [(ollama_name(k), v) for k, v in self.sampling.model_dump().items() if v != getattr(defaults, k)]
            for name, value in changed or [("(the defaults)", "")]:
                err.print(f"{name:<30} {_short(value)}", markup=False, highlight=False)
            return
        if what not in ("", "info"):
            err.print("usage: /show [info|template|system|parameters]", markup=False, highlight=False)
            return
        used = self.conv.context_used()
        n_ctx = self.conv.n_ctx
        defaults = type(self.sampling)()
        options = " ".join(
            f"{k}={_short(v)}" for k, v in self.sampling.model_dump().items()
            if v not in (None, [], {}) and (k in ("temperature", "top_k", "top_p", "min_p", "max_tokens", "seed") or v != getattr(defaults, k))
        )
        rows = [
            ("model", f"{self.conv.name} ({self.conv.model_path})"),
            ("template", "the model's chat template" if self.conv.templated else "none: plain User:/Assistant: transcript"),
            ("system", self.conv.system or "(none)"),
            ("session", self.session or "(none: /save NAME to keep this conversation)"),
            ("conversation", f"{self.conv.turns} turn(s)" + _images_said(self.conv.messages, self.attached)),
            ("context", f"{used} of {n_ctx} tokens used, {n_ctx - used} left ({self.conv.kv_tokens} in the KV cache)"),
            ("options", options),
        ]
        for k, v in rows:
            err.print(f"{k + ':':<14}{v}", markup=False, highlight=False)

    def _template(self) -> Optional[str]:
        """The chat template the conversation is rendered with (the GGUF's own, read from its file)."""
        if not self.conv.templated:
            return None
        engine = getattr(self.conv, "engine", None)  # in this process: the template it renders with (a Modelfile's too)
        if engine is not None:
            return engine.chat_template
        from ..runtime import read_info

        try:
            return read_info(self.conv.model_path).chat_template
        except LocalrunError:
            return None

    def cmd_stats(self, _: str) -> None:
        if self.last is None:
            err.print("no answer yet", markup=False)
            return
        self.print_stats()

    def print_stats(self) -> None:
        from . import render

        engine = getattr(getattr(self.conv, "loaded", None), "engine", None)  # in this process (the server sends its own)
        render.stats(self.last.stats, getattr(engine, "n_threads", None))
        used = self.conv.context_used()
        err.print(f"[dim]{'context:':<24}[/dim]{used} of {self.conv.n_ctx} tokens used", highlight=False)

    def cmd_image(self, args: str) -> None:
        """/image PATH attaches; /image lists what is attached; /image clear drops it."""
        if not args:
            if not self.attached:
                err.print("no image attached: /image PATH attaches one to the next message", markup=False, highlight=False)
            for image in self.attached:
                err.print(f"{image.name} ({_size(len(image.data))})", markup=False, highlight=False)
            return
        if args == "clear" and not _is_file(args):
            n, self.attached = len(self.attached), []
            err.print(f"dropped {n} attached image(s)", markup=False, highlight=False)
            return
        paths = _command_paths(args)
        if paths is None:
            return
        try:
            images = read_image_files(paths)
        except LocalrunError as exc:
            render_error(exc)
            return
        self.attached.extend(images)
        for image in images:
            err.print(f"attached {image.name} ({_size(len(image.data))}) to the next message", markup=False, highlight=False)

    def cmd_save(self, name: str) -> None:
        if not name:
            err.print("usage: /save NAME", markup=False)
            return
        notice(self.conv.save(name))

    def cmd_load(self, name: str) -> None:
        if not name:
            err.print("usage: /load NAME", markup=False)
            return
        notice(self.conv.load(name))
        self.last = None
        if self.session != name:
            # From now on answers extend the conversation just loaded, so they are saved to it, as with
            # --session NAME (saving them to a --session given at start replaced that session with this one).
            self.session = name
            notice(f"answers are now saved to session {name}")


# Ollama's REPL: /set parameter NAME VALUE, /set system TEXT, /set verbose, /set quiet.
def _no_format(chat: Chat, _: str) -> None:
    from ..runtime.options import merge_options

    chat.sampling = merge_options(chat.sampling.model_dump(exclude={"json_schema"}), {})
    err.print("json_schema = None", markup=False, highlight=False)


def _nothing_to_set(word: str) -> Callable[[Chat, str], None]:
    return lambda chat, _: err.print(f"/set {word}: localrun's chat has no such switch (it keeps its history, and the "
                                     "terminal wraps lines)", markup=False, highlight=False)


_OLLAMA_SET: dict[str, Callable[[Chat, str], None]] = {
    "parameter": Chat.set_option, "system": Chat.cmd_system,
    "verbose": lambda chat, _: chat.set_verbose(True), "quiet": lambda chat, _: chat.set_verbose(False),
    # /set format json (any JSON object) or a JSON schema; /set noformat
    "format": lambda chat, rest: chat.set_option(f"json_schema {rest}" if rest else "json_schema"), "noformat": _no_format,
    **{word: _nothing_to_set(word) for word in ("history", "nohistory", "wordwrap", "nowordwrap")},
}


def _with(images: list) -> dict:
    """send's images argument, given only when there are some (a conversation without vision takes none)."""
    return {"images": images} if images else {}


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} KB"


def _images_said(messages: list[dict], attached: list) -> str:
    kept = sum(len(m.get("images") or ()) for m in messages)
    said = [f"{kept} image(s)"] if kept else []
    if attached:
        said.append(f"{len(attached)} attached for the next message")
    return f" ({', '.join(said)})" if said else ""


# -- images named in the input ----------------------------------------------------------------------

_IMAGE_SUFFIX = r"\.(?:png|jpe?g|gif|bmp|webp)"
# A quoted path, or an unquoted one (a backslash escapes the next character: a terminal drops `my\ photo.png`)
# that starts a word and ends one (punctuation after it, as in "look at a.png, then ...", is not the path's).
_NAMED_IMAGE = re.compile(
    rf"""(['"])(?P<quoted>(?:(?!\1).)+?{_IMAGE_SUFFIX})\1"""
    rf"""|(?<![^\s(\[])(?P<bare>(?:\\.|[^\s'"\\(\[])(?:\\.|[^\s'"\\])*?{_IMAGE_SUFFIX})(?=$|[\s,;:!?)\]]|\.(?:\s|$))""",
    re.IGNORECASE,
)


def image_paths_in(text: str) -> tuple[str, list[str]]:
    """The image files `text` names (ones that exist), and the text without them, as Ollama's REPL takes a
    dropped file: a name that is no file stays text."""
    paths: list[str] = []
    out: list[str] = []
    at = 0
    for match in _NAMED_IMAGE.finditer(text):
        name = match.group("quoted") or re.sub(r"\\(.)", r"\1", match.group("bare"))
        if not _is_file(name):
            continue
        paths.append(name)
        out.append(text[at : match.start()])
        at = match.end()
        if at < len(text) and text[at] in " \t" and (not out[-1] or out[-1][-1] in " \t"):
            at += 1  # one of the two spaces around it
    if not paths:
        return text, []
    out.append(text[at:])
    return "".join(out).strip(), paths


def _starts_with_image(line: str) -> bool:
    match = _NAMED_IMAGE.match(line)
    return match is not None and _is_file(match.group("quoted") or re.sub(r"\\(.)", r"\1", match.group("bare")))


def _is_file(name: str) -> bool:
    try:
        return Path(name).expanduser().is_file()
    except (OSError, ValueError, RuntimeError):  # a name too long, a NUL in it, ~user unknown
        return False


def _command_paths(args: str) -> Optional[list[str]]:
    """/image's arguments: the whole of them as one path where that is a file (a name with spaces), else
    shell words (quotes, backslash escapes); None (said) when they do not parse."""
    whole = args.strip()
    if len(whole) > 1 and whole[0] == whole[-1] and whole[0] in "'\"":
        whole = whole[1:-1]
    if _is_file(whole):
        return [whole]
    try:
        return shlex.split(args)
    except ValueError as exc:
        err.print(f"/image {args}: {exc}", markup=False, highlight=False)
        return None


def read_image_files(paths: list[str]) -> list:
    """The files' bytes as images (runtime.images.read_images), each named as given; ImageNotFound naming a
    file that is not there."""
    from ..runtime.images import ImageNotFound, read_images

    for path in paths:
        if not Path(path).expanduser().exists():
            raise ImageNotFound(path, "no such file")
    return read_images([Path(p).expanduser() for p in paths])


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


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

    from ..store.paths import home

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


def chat_loop(conv: "Conversation", *, system: Optional[str], session: Optional[str], verbose: bool) -> int:
    """Run the chat until /bye, Ctrl-D or the end of stdin; return the exit code."""
    interactive = sys.stdin.isatty()
    chat = Chat(conv, system=system, session=session, verbose=verbose, interactive=interactive)
    chat.start()
    return _interactive(chat) if interactive else _piped(chat)
