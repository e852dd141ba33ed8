"""The messages of a chat, as the chat REPL edits them: one base for the conversation held in this process
(conversation.Conversation) and the one the background server holds (remote.RemoteConversation). Standard
library only: the remote one must not import the engine."""

from __future__ import annotations

from typing import Optional


class Messages:
    messages: list[dict]
    # The model's own first messages (a created model's MESSAGEs): every conversation starts with them after the
    # system prompt, as `run` and the HTTP dialects put them (runtime.request.with_system), and /clear keeps them.
    preset: tuple = ()

    def _changed(self) -> None:
        """The messages changed other than by an answer: what was cached for them no longer holds."""

    @property
    def system(self) -> Optional[str]:
        if self.messages and self.messages[0]["role"] == "system":
            return self.messages[0]["content"]
        return None

    def set_system(self, text: Optional[str]) -> None:
        rest = [m for m in self.messages if m["role"] != "system"]
        self.messages = ([{"role": "system", "content": text}] if text else []) + rest
        self._changed()

    def clear(self) -> None:
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"] + [dict(m) for m in self.preset]
        self._changed()

    @property
    def turns(self) -> int:
        """The user's turns (the model's preset messages at the start do not count)."""
        own = [m for m in self.messages if m["role"] != "system"]
        preset = [dict(m) for m in self.preset]
        if preset and own[:len(preset)] == preset:
            own = own[len(preset):]
        return sum(1 for m in own if m["role"] == "user")
