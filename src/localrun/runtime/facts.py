"""What the HTTP layer knows of a loaded model, and nothing more: its vocabulary, its chat template and what
that template can do (tools, thinking), its tokenizer both ways (llama-server's /tokenize and /detokenize), its
fill-in-the-middle prompt (/infill), how long a request's prompt would be and what it renders to (/apply-template),
its LoRA adapters and their scales (/lora-adapters, a request's `lora`), whether it is a reranker. serve reads a
model through `ModelFacts` only (tests/test_architecture.py: serve never touches an engine), as ollama's scheduler
sees a runner through a small interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..engine import formats, thinking
from ..engine.prompt import render
from . import lora
from .request import Request, TemplateDefaults, prompt_for, with_system

# llama.cpp's names for the repository and file-separator tokens of repo-level fill-in-the-middle (llama-vocab.cpp),
# where a GGUF does not give their ids (tokenizer.ggml.fim_rep_token_id, fim_sep_token_id)
_FIM_REP = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP = ("<|file_sep|>",)
_SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's separator of extra chunks where the model has no file separator


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
    def template_defaults(self) -> TemplateDefaults:
        """What the server gives a chat request that does not say otherwise (serve --reasoning, --reasoning-effort,
        --chat-template-kwargs)."""
        return self._loaded.template_defaults or TemplateDefaults()

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

    def tokens_of(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """`text` as tokens as llama-server's /tokenize makes them: special markers read as such unless
        `parse_special` is false, BOS (and EOS where the model adds one) only with `add_special`."""
        return self._loaded.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def piece(self, token: int) -> bytes:
        """A token's text as llama-server gives it (/tokenize's pieces, /detokenize): special markers written out."""
        return self._loaded.engine.token_bytes(token, special=True)

    def detokenize(self, tokens: list[int]) -> str:
        """Tokens as text, each special marker written out (llama-server's /detokenize)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    @property
    def bos_text(self) -> str:
        engine = self._loaded.engine
        return self.piece(engine.bos_token).decode("utf-8", "replace") if 0 <= engine.bos_token < engine.n_vocab else ""

    @property
    def eos_text(self) -> str:
        eos = self.info.eos_token_id
        return self.piece(eos).decode("utf-8", "replace") if eos is not None and 0 <= eos < self.n_vocab else ""

    @property
    def adds_bos(self) -> bool:
        return self._loaded.engine.add_bos

    @property
    def n_ctx_train(self) -> int:
        return self.info.context_length

    @property
    def n_embd(self) -> int:
        return self.info.n_embd

    def infill_prompt(self, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt: list[int], *, n_batch: int,
                      n_predict: int, n_ctx: int) -> Optional[list[int]]:
        """llama-server's /infill prompt (format_prompt_infill, repo-level fill-in-the-middle): the extra files
        (`extra`: (file name, text) pairs) each after the model's file separator, then the prefix and `prompt`
        (tokens: the text typed before the cursor) in FIM_PRE, the suffix in FIM_SUF, FIM_MID; the prefix and suffix
        cut to a batch (3:1), the extra files to the context left after a batch and twice the answer. None for a model
        without fill-in-the-middle tokens."""
        frame = self._loaded.engine.infill_tokens("", "")  # [BOS,] FIM_PRE, FIM_SUF, FIM_MID: the model's own
        if frame is None:
            return None
        bos, (pre, suf, mid) = frame[:-3], frame[-3:]
        rep, sep = self._special(_FIM_REP, "fim_rep"), self._special(_FIM_SEP, "fim_sep")
        chunks: list[int] = [rep, *self.tokenize("myproject\n")] if rep is not None else []
        for name, text in extra:
            chunks += [sep, *self.tokenize(name + "\n")] if sep is not None else self.tokenize(_SNIPPET)
            chunks += self.tokenize(text)
        if sep is not None:
            chunks += [sep, *self.tokenize("filename\n")]
        before, after = self.tokenize(prefix), self.tokenize(suffix)
        before = before[len(before) - min(len(before), 3 * (n_batch // 4)):]
        after = after[:min(len(after), max(0, n_batch // 4 - (2 + len(prompt))))]
        n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(chunks))
        return [*(chunks[len(chunks) - n_extra:] if n_extra else []), *bos, pre, *before, *prompt, suf, *after, mid]

    def _special(self, names: tuple[str, ...], key: str) -> Optional[int]:
        """A special token's id: the GGUF's tokenizer.ggml.KEY_token_id, else the first of `names` that is one
        token of its own, as llama.cpp finds it."""
        given = (self.info.metadata or {}).get(f"tokenizer.ggml.{key}_token_id") if self.info is not None else None
        if isinstance(given, int) and 0 <= given < self.n_vocab:
            return given
        for name in names:
            tokens = self.tokens_of(name)
            if len(tokens) == 1 and self.piece(tokens[0]) == name.encode():
                return tokens[0]
        return None

    # -- LoRA adapters (runtime.lora: each refusal a LoraRequestError, the setting "lora") ------------------------

    @property
    def adapters(self) -> list[dict[str, Any]]:
        """The LoRA adapters it was loaded with, as llama-server's GET /lora-adapters lists them (id, path, scale,
        task_name, prompt_prefix); [] for none."""
        return lora.listed(self._loaded)

    def lora_scales(self, entries: Any) -> tuple[float, ...]:
        """A request's `lora` ([{"id", "scale"}]) as the scales runtime.Request.lora takes."""
        return lora.request_scales(self._loaded, entries)

    def set_lora_defaults(self, entries: Any) -> list[dict[str, Any]]:
        """POST /lora-adapters: the scales every later request that names none is answered under."""
        return lora.set_default_scales(self._loaded, entries)

    @property
    def reranks(self) -> bool:
        """Whether it was loaded as a reranker (rank pooling: runtime.rerank)."""
        return self._loaded.engine.options.pooling == "rank"

    def rendered(self, request: Request, add_generation_prompt: bool = True) -> str:
        """The text `request`'s prompt is for this model, as its template renders it (llama-server's /apply-template),
        with the model's default system prompt where the request has none, as it is answered; without the
        assistant's turn opened where `add_generation_prompt` is false."""
        request.messages = with_system(request, self._loaded.system)
        return render(self._loaded.engine, request.messages, raw=request.raw, add_generation_prompt=add_generation_prompt,
                      tools=request.tools, think=request.think, kwargs=request.template_kwargs).text

    def prompt_length(self, request: Request) -> int:
        """How many tokens `request`'s prompt is for this model, whether it fits a slot or not (with the model's
        default system prompt where the request has none, as it is answered)."""
        request.messages = with_system(request, self._loaded.system)
        return len(prompt_for(self._loaded.engine, request, n_ctx=1 << 30).tokens)


def facts_of(resident) -> ModelFacts:
    """The facts of a pool's resident model (runtime.serving.pool.Resident), or of a runtime.loader.Loaded."""
    return ModelFacts(getattr(resident, "loaded", resident))
