"""The messages of a chat, as the chat REPL edits them: one base for the conversation held in this process
(conversation.Conversation) and the one the background server holds (remote.RemoteConversation). Standard
library only: the remote one must not import the engine."""

from __future__ import annotations

from typing import Optional


class Messages:
    messages: list[dict]

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
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
        self._changed()

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")
