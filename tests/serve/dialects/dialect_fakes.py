"""What the dialect tests stand on instead of a model: the facts a loaded model would give (FakeFacts, as
runtime.facts.ModelFacts: a real chat template from tests/data/templates, a made-up vocabulary), an answer's
events canned (as ollama's middleware tests answer with their mockRunner), and the writers' output read back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Optional

from localrun.engine.types import Response, Stats
from localrun.runtime import SamplingOptions, family_for, markers_for, supports_tools
from localrun.runtime.request import TemplateDefaults
from localrun.serve.stream import Event

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "templates"


class FakeFacts:
    """A model's facts (runtime.facts.ModelFacts) without a model: token N's text is "tN"."""

    def __init__(self, template: Optional[str] = "Qwen-Qwen2.5-7B-Instruct", n_vocab: int = 1000, infill: bool = False,
                 sampling: Optional[SamplingOptions] = None, template_defaults: Optional[TemplateDefaults] = None):
        self.template_defaults = template_defaults or TemplateDefaults()  # the server's (serve --reasoning ...)
        self.chat_template = (TEMPLATES / f"{template}.jinja").read_text() if template else None
        self.n_vocab, self.infill = n_vocab, infill
        self.sampling = sampling or SamplingOptions()
        self.path, self.file_name = Path("/models/fake.gguf"), "fake.gguf"
        self.gpu_notice, self.info = None, None

    @property
    def thinks(self) -> bool:
        return markers_for(self.chat_template) is not None

    @property
    def calls_tools(self) -> bool:
        return supports_tools(self.chat_template) or family_for(self.chat_template).calls is not None

    def token_bytes(self, token: int) -> bytes:
        return f"t{token}".encode()

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def infill_tokens(self, prefix: str, suffix: str) -> Optional[list[int]]:
        return [1, *self.tokenize(prefix), 2, *self.tokenize(suffix), 3] if self.infill else None


def final(reason: str = "stop", prompt: int = 5, generated: int = 3, cached: int = 0, **more) -> Response:
    return Response(finish_reason=reason, stats=Stats(prompt_tokens=prompt, generated_tokens=generated, cached_tokens=cached),
                    **more)


def written(writer) -> list[str]:
    """What a writer (an async iterator of wire text) writes, whole."""
    async def read() -> list[str]:
        return [line async for line in writer]
    return asyncio.run(read())


async def canned(*events: Event):
    """An answer's events, as serve.stream.answer_events would give them."""
    for event in events:
        yield event


def sse_data(lines: list[str]) -> list:
    """The data of server-sent events (comments and [DONE] as they are)."""
    out = []
    for line in lines:
        for part in line.split("\n"):
            if part.startswith("data: "):
                data = part[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
            elif part.startswith(":"):
                out.append(part)
    return out
