"""What a model's answer is read as: a message (thinking, content, tool calls), and what changes from one
reading of a streaming answer to the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ToolCall:
    name: str
    arguments: str = ""  # the arguments as JSON text (an object); while streaming, as much as is known of it
    id: str = ""  # the id the model wrote itself (Kimi's functions.NAME:0, Mistral's [CALL_ID]), else ""


@dataclass
class Message:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Delta:
    """What changed from one reading to the next: text added to the reasoning or the content, or to one call
    (its index; its name and id the first time it is seen, then what its arguments grew by)."""

    reasoning: str = ""
    content: str = ""
    call_index: Optional[int] = None
    name: str = ""
    id: str = ""
    arguments: str = ""
