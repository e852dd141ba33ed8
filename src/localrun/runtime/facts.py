"""What the HTTP layer knows of a loaded model, and nothing more: its vocabulary, its chat template and what
that template can do (tools, thinking), its tokenizer both ways, its fill-in-the-middle tokens and how long a
request's prompt would be. serve reads a model through `ModelFacts` only (tests/test_architecture.py: serve
never touches an engine), as ollama's scheduler sees a runner through a small interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..engine import formats, thinking
from .request import Request, prompt_for, with_system


class ModelFacts:
    """A read-only view of one loaded model (runtime.loader.Loaded): cheap to make, made per request."""

    __slots__ = ("_loaded",)

    def __init__(self, loaded) -> None:
        self._loaded = loaded

    @property
    def path(self) -> Path:
        return self._loaded.engine.path

    @property
    def file_name(self) -> str:
        """The model file's name, as errors about what the model cannot do name it."""
        return self._loaded.engine.path.name

    @property
    def n_vocab(self) -> int:
        return self._loaded.engine.n_vocab

    @property
    def chat_template(self) -> Optional[str]:
        return self._loaded.engine.chat_template

    @property
    def sampling(self) -> Any:
        """Its sampling options (engine.SamplingOptions): the catalogue's and the server's flags; what a request sets
        goes over them."""
        return self._loaded.sampling

    @property
    def info(self) -> Any:
        """The GGUF header's facts (engine.gguf_info.ModelInfo), as listings show them."""
        return self._loaded.engine.info

    @property
    def gpu_notice(self) -> Optional[str]:
        """What its load said of the GPU (a fallback to the CPU), or None."""
        return self._loaded.engine.gpu_notice

    @property
    def thinks(self) -> bool:
        """Whether its template has a reasoning model's thinking markers."""
        return thinking.markers_for(self.chat_template) is not None

    @property
    def calls_tools(self) -> bool:
        """Whether its answers are read for tool calls: its template renders tools, or its family writes calls in
        a format of its own even where the template does not describe them (DeepSeek V3.1's and R1's)."""
        template = self.chat_template
        return formats.supports_tools(template) or formats.family_for(template).calls is not None

    def tokenize(self, text: str) -> list[int]:
        """`text` as tokens, special markers read as text (an answer's text, continued from)."""
        return self._loaded.engine.tokenize(text, add_special=False, parse_special=False)

    def token_bytes(self, token: int) -> bytes:
        return self._loaded.engine.token_bytes(token)

    def infill_tokens(self, prefix: str, suffix: str) -> Optional[list[int]]:
        """The fill-in-the-middle prompt between `prefix` and `suffix`, or None for a model without those tokens."""
        return self._loaded.engine.infill_tokens(prefix, suffix)

    def prompt_length(self, request: Request) -> int:
        """How many tokens `request`'s prompt is for this model, whether it fits a slot or not (with the model's
        default system prompt where the request has none, as it is answered)."""
        request.messages = with_system(request, self._loaded.system)
        return len(prompt_for(self._loaded.engine, request, n_ctx=1 << 30).tokens)


def facts_of(resident) -> ModelFacts:
    """The facts of a pool's resident model (runtime.pool.Resident), or of a runtime.loader.Loaded."""
    return ModelFacts(getattr(resident, "loaded", resident))
