"""The one Rich console (stderr): notices, warnings and a status line. Everything that is not the answer goes here."""

from __future__ import annotations

import os
import sys


THEME = {
    "error": "bold red",
    "warning": "yellow",
    "notice": "cyan",
    "dim": "dim",
    "ok": "green",
}


class _LazyConsole:
    """The stderr console, created on first use: importing Rich costs start-up time `--help` need not pay."""

    _console = None

    def real(self):
        """The Rich Console itself (for Progress/Live, which need more than attribute access)."""
        if _LazyConsole._console is None:
            from rich.console import Console
            from rich.theme import Theme

            # emoji=False: paths and prompts in messages may hold ":x:" and the like, which Rich would replace.
            _LazyConsole._console = Console(stderr=True, theme=Theme(THEME), highlight=False, soft_wrap=True, emoji=False)
        return _LazyConsole._console

    def __getattr__(self, name):
        return getattr(self.real(), name)


# Everything that is not the answer goes to stderr, so stdout composes in pipelines.
err = _LazyConsole()


class StatusLine:
    """A one-line status on stderr (a terminal only) that changes when told to and at no other time.

    For commands that take timings: Rich's spinner redraws from its own thread 12.5 times a second, and on a
    2-core machine that thread preempts one of llama.cpp's compute threads; `bench` measured decode about 3%
    slower with it. Lines printed through `print` appear above the status.
    """

    def __init__(self, text: str):
        self.text = text
        self.live = err.is_terminal

    def _draw(self) -> None:
        if self.live:
            width = max(10, err.width - 1)
            err.file.write("\r\x1b[2K" + self.text[:width])
            err.file.flush()

    def _clear(self) -> None:
        if self.live:
            err.file.write("\r\x1b[2K")
            err.file.flush()

    def __enter__(self) -> "StatusLine":
        self._draw()
        return self

    def __exit__(self, *exc) -> None:
        self._clear()

    def update(self, text: str) -> None:
        self.text = text
        self._draw()

    def print(self, *args, **kwargs) -> None:
        self._clear()
        err.print(*args, **kwargs)
        self._draw()


def debug_enabled() -> bool:
    return os.environ.get("LOCALRUN_DEBUG", "") not in ("", "0")


def notice(message: str) -> None:
    err.print(f"[notice]{message}[/notice]")


def warn(message: str) -> None:
    err.print(f"[warning]warning:[/warning] {message}")


def stdout_write(text: str) -> None:
    """Write answer text to stdout at once (flush per token), for pipelines."""
    sys.stdout.write(text)
    sys.stdout.flush()
