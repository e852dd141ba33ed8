"""Options as the layers above see them: the one list of sampling options (plain data, cheap to import for
the command line's flags), its one merge, decoding strategies and load-time settings (imported on use)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from ..engine.options import BY_NAME, DRAFT_MAX, KV_TYPES, MIN_CONTEXT, SAMPLING, Option, check_context, cli_value, text_value
from ..errors import Phrase, SettingError, UsageError
from ..lazy import exports

_WHERE = {
    "LoadOptions": "..engine.model", "parse_gpu_layers": "..engine.model",
    "OptionError": "..engine.sampling", "SamplingOptions": "..engine.sampling", "merge_options": "..engine.sampling",
    "json_grammar": "..engine.sampling",
    "DecodeOptions": "..engine.strategies",
}
__all__ = ["BY_NAME", "FOREVER", "parse_keep_alive", "ollama_name", "DRAFT_MAX", "SLOT_DRAFTS", "KV_TYPES", "LOAD_FIELDS", "LOAD_OPTIONS", "MIN_CONTEXT", "LoadSpec", "check_context", "has_sliding_window", "SAMPLING", "Option", "cli_value", "text_value", *sorted(_WHERE)]
__getattr__ = exports(globals(), _WHERE)

# A model's keep-alive, read here rather than in serving.pool: run and chat read their --keep-alive before they know
# whether a server answers (the pool is the server's, 10 ms to import that an answer in the process never uses).
FOREVER = -1.0  # keep_alive < 0: never expires (evicted only to make room, or by `stop`)
FOREVER_AFTER_S = 10 * 365 * 86400.0


def parse_keep_alive(value: Any) -> float:
    """Seconds from a keep_alive as Ollama takes it: a number of seconds, or a duration "90s", "5m", "1h",
    "1h30m"; negative = forever, 0 = unload after the answer; past 10 years, forever."""
    import math
    import re

    bad = UsageError(f"invalid keep-alive {value!r}: use seconds or a duration like 5m, 0 or -1")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = re.fullmatch(r"(-)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
            if not text or parts is None or not any(parts.groups()[1:]):
                raise bad from None
            sign, h, m, s = parts.groups()
            seconds = (-1 if sign else 1) * (float(h or 0) * 3600 + float(m or 0) * 60 + float(s or 0))
    if math.isnan(seconds):
        raise bad
    return FOREVER if seconds < 0 or seconds > FOREVER_AFTER_S else seconds


# Ollama's option names (api.Options and api.Runner) where they are not localrun's own: what its clients send
# in `options`, chat's `/set parameter` and a Modelfile's PARAMETER lines name.
OLLAMA_RENAMED = {"num_predict": "max_tokens"}
_OLLAMA_NAME = {ours: theirs for theirs, ours in OLLAMA_RENAMED.items()}
OLLAMA_LOAD = {"num_ctx": "ctx", "num_gpu": "gpu_layers", "num_thread": "threads", "num_batch": "batch"}  # load-time
# The one table of the load options a request may name in `options` (serve.checks.load_options): Ollama's names
# (api.Runner), plus localrun's for the slots, the KV cache and flash attention; each to its LoadSpec field.
LOAD_OPTIONS = {**OLLAMA_LOAD, "num_parallel": "parallel", "kv_type": "kv_type", "flash_attn": "flash_attn"}
OLLAMA_IGNORED = ("num_keep", "penalize_newline", "numa", "main_gpu", "low_vram", "vocab_only", "use_mmap", "use_mlock", "tfs_z",
                  "f16_kv", "logits_all", "embedding_only", "rope_frequency_base", "rope_frequency_scale", "num_gqa")  # older clients send these


@dataclass(frozen=True)
class LoadSpec:
    """The load-time options (Ollama's api.Runner), the one shape of them: built from a command's flags, a
    request's `options` (serve.checks.load_options) or a bench row; `runtime.loader.load` loads by it, the server's pool
    compares it (a request asking for other values reloads the model), and `engine_options` is the one place
    it becomes the engine's LoadOptions."""

    ctx: Optional[int] = None  # per slot; None = the model's own (runtime.loader.context_for)
    parallel: int = 1  # slots (sequences) in the context
    gpu_layers: str = "auto"
    flash_attn: Optional[bool] = None
    kv_type: str = "f16"
    threads: Optional[int] = None
    batch: int = 512
    rpc: Optional[str] = None  # llama.cpp RPC workers, HOST:PORT,... (engine.rpc)
    tensor_split: Optional[str] = None
    kind: str = "batch"  # batch: the HTTP dialects' continuous batching; run: run/chat's request path, a slot each;
    # embed: an embeddings context (its requests take turns, each batched)
    draft: Optional[str] = None  # "lookup" (prompt-lookup speculation), a draft model, "none"; None: the model's default
    draft_max: Optional[int] = None  # most tokens drafted per sequence and step; None: the drafter's default
    beams: int = 1  # beam search (in this process only: the server's slots do not search beams)
    length_penalty: float = 1.0
    pooling: Optional[str] = None  # an embeddings context's pooling (None: the model's own)
    # LoRA adapters, (absolute path, scale) each (--lora FILE[:SCALE], runtime.lora.parse_adapters): loaded with the
    # model, so a model loaded with other adapters or scales is another load; a request picks other scales without one.
    lora: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        # (as a client sends them on the wire: lists; the pool compares loads by value)
        object.__setattr__(self, "lora", tuple((str(path), float(scale)) for path, scale in self.lora))

    def decoding(self, default_draft: Optional[str] = None):
        """The decoding strategy these options ask for (engine.strategies.DecodeOptions, checked). `default_draft`:
        the model's own (a code model's catalogue entry), taken where they name none and search no beams;
        --draft none turns it off."""
        from ..engine.strategies import DecodeOptions

        draft = self.draft if self.draft is not None else default_draft if self.beams == 1 else None
        draft_max = self.draft_max
        if draft_max is None and draft == "lookup":  # the default fits the batch (a code model's --batch 16 still loads)
            from ..engine.options import LOOKUP_DRAFT_MAX

            draft_max = max(1, min(LOOKUP_DRAFT_MAX, self.batch - 1))
        return DecodeOptions(draft=None if draft == "none" else draft, draft_max=draft_max, beams=self.beams,
                             length_penalty=self.length_penalty)

    def engine_options(self, n_ctx: int, decoding=None, answer_room: Optional[int] = None, *, sliding: bool = False):
        """The engine's LoadOptions for a context of `n_ctx` tokens, as much as one request may fill (checked: a
        bad value raises here), with what `decoding` needs beside (engine.strategies.context_options;
        `answer_room`: the most tokens an answer takes, for beams). `sliding`: the model has sliding-window
        layers (see shares_kv)."""
        from ..engine.model import LoadOptions, parse_gpu_layers
        from ..engine.rpc import parse_endpoints
        from ..engine.strategies import context_options
        from .workers import parse_tensor_split

        placed = dict(n_threads=self.threads, gpu_layers=parse_gpu_layers(self.gpu_layers), flash_attn=self.flash_attn,
                      kv_type=self.kv_type, rpc=parse_endpoints(self.rpc), tensor_split=parse_tensor_split(self.tensor_split),
                      lora=self.lora)
        if self.kind == "embed":  # one pool of cells for every text of a batch; a text must fit one batch
            return LoadOptions(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_seq_max=EMBED_SEQUENCES, kv_unified=True,
                               embeddings=True, pooling=self.pooling, **placed)
        check_slots(self.batch, self.parallel)
        check_context(n_ctx)
        # Several sequences (a server's slots): one pool of n_ctx cells for the background server's (shares_kv),
        # else a stream of n_ctx each. A step asks for one row of logits per sequence (a strategy asks for more:
        # context_options).
        shared = self.shares_kv(sliding)
        options = LoadOptions(n_ctx=n_ctx if shared else n_ctx * self.parallel, n_batch=self.batch, n_ubatch=self.batch,
                              n_seq_max=self.parallel, n_outputs=self.parallel, shared_kv=shared, **placed)
        return context_options(decoding or self.decoding(), options, n_ctx if answer_room is None else answer_room)

    def shares_kv(self, sliding: bool) -> bool:
        """Whether the slots keep one KV pool of the context (llama.cpp's unified KV, as llama-server keeps its
        slots by default) rather than a stream of it each: the background server's run and chat slots do. A
        stream of the whole context per slot, allocated and resident whether used or not, made its default for
        Qwen2.5-Coder-1.5B (32768) a 3.8 GB KV cache before anyone asked for a long context; in one pool a
        request may still fill all of it. `serve`'s slots keep a stream each: in one pool a sequence's cells lie
        among the others', its attention sums run in another order, and its greedy output would depend on what
        else is in the batch (the background server evicts what idle slots keep before a request that runs
        alone, so that one answers as in-process: runtime.serving.scheduler). Nor for a model with sliding-window
        layers (`sliding`): llama.cpp's state of one sequence in a pool keeps only their last window, and a
        slot's session could not be cut back to a shorter prefix, where engine.kv saves a stream whole."""
        return self.kind == "run" and self.parallel > 1 and not sliding

    def kv_streams(self, info) -> int:
        """The KV streams of a context loaded by these options for a model (its slots', or one shared pool)."""
        return 1 if self.shares_kv(has_sliding_window(info)) else self.parallel

    def check(self) -> None:
        """Refuse, before any model loads, what the server's slots cannot take (the same messages loading
        would give)."""
        if self.draft not in SLOT_DRAFTS:
            raise UsageError(Phrase("the server's slots draft by prompt lookup only ({draft} lookup), not with a draft"
                                    " model ({model}): run it with `localrun run --draft {model} --keep-alive 0`",
                                    model=self.draft))
        if self.beams > 1:
            raise UsageError("the server's slots do not search beams: run it with `localrun run --beams N --keep-alive 0`")
        # The context as given, per slot (0 or 10 are refused, not read as 4096 nor checked as 4 slots' 40).
        self.engine_options(FALLBACK_CONTEXT if self.ctx is None else self.ctx)

    def differences(self, other: "LoadSpec") -> list[str]:
        mine, theirs = asdict(self), asdict(other)
        return [f"{k} {mine[k]} -> {theirs[k]}" for k in mine if mine[k] != theirs[k]]

    def sent(self) -> dict[str, Any]:
        """What a client sends the background server of its load (LOAD_FIELDS; the server decides the rest)."""
        return {name: getattr(self, name) for name in LOAD_FIELDS}


# What a client's flags set of a model's load: the server decides the slots and the kind, and searches no beams.
LOAD_FIELDS = tuple(f.name for f in fields(LoadSpec) if f.name not in ("parallel", "kind", "beams", "length_penalty", "pooling"))
# The --draft values the server's slots take (prompt lookup, none, the model's default); a draft model, loaded per
# run, decodes in-process.
SLOT_DRAFTS = (None, "lookup", "none")
FALLBACK_CONTEXT = 4096  # where nothing better is known (no trained length, no memory to size by)
SERVER_SLOTS = 4  # serve's --parallel by default: the background server's slots for run and chat too
EMBED_SEQUENCES = 16  # texts embedded per decode (an embeddings context's sequences)


def ollama_name(setting: str) -> str:
    """A sampling option as Ollama names it (num_predict, not max_tokens): the inverse of OLLAMA_RENAMED, for what
    shows a model's parameters in Ollama's words (a Modelfile, /api/show, chat's /show parameters)."""
    return _OLLAMA_NAME.get(setting, setting)


def has_sliding_window(info) -> bool:
    """Whether a model (engine.gguf_info.ModelInfo) has sliding-window attention layers (gemma-3's)."""
    return bool(info.sliding_window) and (any(info.swa_layers) if info.swa_layers else True)


def check_slots(batch: int, parallel: int) -> None:
    """--batch and --parallel: each step decodes one token per sequence, so the batch holds them all."""
    if batch < 1:
        raise SettingError("batch", batch, "use 1 or more")
    if parallel < 1:
        raise SettingError("parallel", parallel, "use 1 or more")
    if parallel > batch:
        # (the batch is at fault, not the slots: a request sets the one, the server the other)
        raise SettingError("batch", batch, Phrase("each step decodes a token of every sequence, so it must hold at least"
                                                  " {least}, one per slot (raise {batch} or lower {parallel})", least=parallel))
