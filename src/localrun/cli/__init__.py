"""The localrun command line: Typer commands, shared options, terminal rendering, the chat REPL, the bench
front-end. It reaches models through the runtime, never the engine directly."""

from .main import app, main

__all__ = ["app", "main"]
