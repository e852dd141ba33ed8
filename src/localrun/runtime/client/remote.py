"""A chat's conversation kept by the resident server (runtime.serving.resident.converse), with the interface of
runtime.conversation.Conversation, so that the chat REPL reads the same either way.

The messages are kept here too and go with every request: the server rebuilds a conversation it no longer
has from them. The first Ctrl-C asks the server to stop the answer at its next token (POST /api/cancel: the
answer ends as 'interrupted' and what was shown stays in the conversation, as in-process); a second one
closes the connection, which stops it too, and the message is dropped here (the server's copy is replaced
by these messages on the next request).

Images go with their message as base64 bytes (runtime.images.stored), read here when the user attaches
them: the server runs on this machine, but the bytes are what was attached (a file changed or moved later
changes nothing), a path relative to the chat's folder needs no translating, and the server keeps them for
the conversation and its session either way. They are sent with every request, as the messages are (over a
local socket; the server sends none back that it was sent).

The sessions it opens, loads or saves are held for writing here, in the chat's own process (store.writers):
the server saves them for this chat, and refuses any other writer of them while this process lives.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from ...store.writers import SessionClaims
from . import resident, resident_stream
from ..messages import Messages


class RemoteConversation(Messages):
    def __init__(self, model: str, *, load: dict, sampling: dict, keep_alive: float, source: str,
                 on_notice: Callable[[str], None], mmproj: Optional[Path] = None):
        """Ask the server for the model (loading it there); raises client.ServerDeclined where this process
        should chat instead. `mmproj`: the projector for the chat's images (the server loads it with the first)."""
        from .. import merge_options

        self.key = uuid.uuid4().hex
        self.mmproj = str(Path(mmproj).expanduser().resolve()) if mmproj is not None else None
        self._sending: list[dict] = []  # the images of the message being sent (a message of their own, for images_in)
        self.model, self.load_options, self.keep_alive, self.source = model, load, keep_alive, source
        self.on_notice = on_notice
        self.tty = sys.stderr.isatty()  # advice for a person at a terminal (runtime.serving.resident.busy_notice)
        self.claims = SessionClaims(on_wait=on_notice)
        self.messages: list[dict] = []
        info = self._one("info", sampling=sampling)["info"]
        self.name: str = info["name"]
        self.ref: str = info["ref"]
        self.model_path = Path(info["path"])
        self.n_ctx: int = info["n_ctx"]
        self.templated: bool = info["templated"]
        self.default_system: Optional[str] = info["system"]
        self.preset = tuple(info.get("messages") or ())
        self.sampling = merge_options(info["sampling"])
        self.kv_tokens = 0
        self._context_used: Optional[tuple[list[dict], int]] = None  # (for these messages, tokens)

    # -- the requests -------------------------------------------------------------------------------

    def _stream(self, op: str, **fields: Any):
        messages = self.messages
        if any(m.get("images") for m in messages):
            from ..images import stored

            messages = stored(messages)
        request = {"op": op, "conversation": self.key, "messages": messages, "tty": self.tty, **fields}
        if self.mmproj is not None:
            request["mmproj"] = self.mmproj
        return resident_stream("/api/converse", self.model, load=self.load_options, request=request,
                               keep_alive=self.keep_alive, source=self.source, on_notice=self.on_notice)

    def _one(self, op: str, **fields: Any) -> dict:
        result: dict = {}
        for item in self._stream(op, **fields):
            result.update(item)
        self._learn(result)
        return result

    def _learn(self, result: dict) -> None:
        if "messages" in result:
            messages = result["messages"]
            if any(m.get("images") for m in messages):  # the bytes of those this client sent are not sent back
                from ..images import images_in, live

                messages = live(messages, {**images_in(self.messages), **images_in(self._sending)})
            self.messages = messages
        if "kv_tokens" in result:
            self.kv_tokens = result["kv_tokens"]
        if "context_used" in result:
            self._context_used = (list(self.messages), result["context_used"])

    # -- the conversation (as Conversation's) -----------------------------------------------------------

    def reset_cache(self) -> None:
        """After a second Ctrl-C: the connection closed, which stopped the answer on the server."""

    def context_used(self) -> int:
        if self._context_used is None or self._context_used[0] != self.messages:
            self._one("info")
        return self._context_used[1]

    def hold_session(self, name: str) -> None:
        self.claims.hold(name)

    def save(self, name: str) -> str:
        self.claims.hold(name)
        return self._one("save", name=name)["said"]

    def load(self, name: str) -> str:
        self.claims.hold(name)
        return self._one("load", name=name)["said"]

    def send(self, text: str, sampling, on_piece: Callable[[str], None], cancelled: Callable[[], bool] = lambda: False,
             on_dropped: Callable[[int], None] = lambda n: None, save_as: Optional[str] = None,
             on_save_failed: Callable[[str], None] = lambda message: None, on_thinking: Callable[[str], None] = lambda t: None,
             images: Sequence = (), on_progress: Callable = lambda progress: None):
        from .. import Response, Stats

        if save_as:
            self.claims.hold(save_as)
        fields: dict[str, Any] = {}
        if images:
            from ..images import stored_images

            fields["images"] = stored_images(images)
        self._sending = [{"images": list(images)}]
        items = self._stream("send", text=text, sampling=sampling.model_dump(mode="json"), session=save_as, **fields)
        answered = threading.Event()
        threading.Thread(target=self._cancel_when, args=(cancelled, answered), daemon=True).start()
        shown: list[str] = []
        result: dict = {}
        try:
            for item in items:
                if "text" in item:
                    shown.append(item["text"])
                    on_piece(item["text"])
                elif "thinking" in item:
                    on_thinking(item["thinking"])
                elif "dropped" in item:
                    on_dropped(item["dropped"])
                elif "progress" in item:  # a long prompt's evaluation on the server, chunk by chunk
                    from ...engine.types import Progress

                    on_progress(Progress(**item["progress"]))
                elif "warning" in item:
                    on_save_failed(item["warning"])
                else:
                    result.update(item)
        finally:
            answered.set()
            items.close()
        self._learn(result)
        self._sending = []
        done = result["done"]
        stats = Stats(**done["stats"]) if done.get("stats") else None
        if stats is not None and done.get("threads"):
            stats.threads = done["threads"]  # the server's CPU threads, for the chat's stats
        return "".join(shown), Response(text="", tokens=[], finish_reason=done["finish_reason"], stats=stats,
                                        error=done.get("error_text"))

    def _cancel_when(self, cancelled: Callable[[], bool], answered: threading.Event) -> None:
        """The first Ctrl-C (`cancelled`) while the answer streams: ask the server to stop it."""
        while not answered.wait(0.05):
            if cancelled():
                try:
                    resident().call("POST", "/api/cancel", {"conversation": self.key}, check=False)
                except Exception:  # noqa: BLE001 - the server went away: the stream says so
                    pass
                return
