"""Loading a model for generation: resolve the reference (pulling it if needed), check every option before
llama.cpp sees the file, load it with its decoding strategy, and keep its catalogue defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..engine import DecodeOptions, Engine, LoadOptions, SamplingOptions, merge_options, parse_gpu_layers
from ..engine.strategies import PLAIN, context_options, load_draft, make_strategy
from ..errors import SettingError, UsageError


@dataclass
class Loaded:
    """A model ready to generate: its engine and strategy, its catalogue defaults and the merged sampling
    options."""

    engine: Engine
    name: str
    sampling: SamplingOptions
    system: Optional[str] = None
    decoding: DecodeOptions = field(default_factory=DecodeOptions)
    strategy: Any = PLAIN
    defaults: dict = field(default_factory=dict)  # the catalogue's sampling: for requests that bring their own options
    messages: tuple = ()  # a conversation's first messages (a created model's MESSAGEs), after the system prompt
    brought: Any = None  # hub.ModelDefaults: what the model's name brought (two names of one file may differ)

    @property
    def ref(self) -> str:
        """What loads this model again: its alias or owner/repo, or for a file given by path the full path
        (a session's "resume it with ..." hint named the bare file name, which does not load)."""
        return str(self.engine.path) if self.name == self.engine.path.name else self.name

    def close(self) -> None:
        self.strategy.close()
        self.engine.close()


def load(
    model: str,
    *,
    source: str = "auto",
    ctx: Optional[int] = None,
    gpu_layers: str = "auto",
    flash_attn: Optional[bool] = None,
    kv_type: str = "f16",
    threads: Optional[int] = None,
    batch: int = 512,
    sampling: Optional[dict[str, Any]] = None,
    on_notice=None,
    parallel: int = 1,
    decoding: Optional[DecodeOptions] = None,
    embeddings: bool = False,
    pooling: Optional[str] = None,
    rpc: Optional[str] = None,
    tensor_split: Optional[str] = None,
) -> Loaded:
    """Resolve `model` (pulling it if needed), validate every option, then load llama.cpp. `sampling`: the
    request's sampling values (None = not given), merged over the catalogue's defaults. `embeddings`: an
    embeddings context instead (runtime.embed): `ctx` tokens, any text up to that long in one batch, and
    EMBED_SEQUENCES texts per decode sharing them."""
    from .. import hub
    from ..engine.rpc import parse_endpoints
    from .workers import parse_tensor_split

    brought = hub.defaults_for(model)
    defaults = dict(brought.sampling)
    placed = dict(rpc=parse_endpoints(rpc), tensor_split=parse_tensor_split(tensor_split))
    merged = merge_options(defaults, sampling)
    layers = parse_gpu_layers(gpu_layers)
    check_slots(batch, parallel)
    decoding = decoding or DecodeOptions()
    if decoding.draft is None and decoding.beams == 1 and brought.draft and not embeddings:  # a code model's default
        decoding = DecodeOptions(draft=brought.draft, draft_max=decoding.draft_max)
    given = context_for(ctx, brought, None, embeddings=embeddings)
    options = _context(given, parallel, batch, threads, layers, flash_attn, kv_type, pooling, placed, embeddings, decoding, merged)
    local = hub.ensure_local(model, source=source)  # (every option was checked first: nothing is pulled for a bad one)
    n_ctx = context_for(ctx, brought, local.path, parallel, kv_type, embeddings=embeddings)
    if n_ctx != given:
        options = _context(n_ctx, parallel, batch, threads, layers, flash_attn, kv_type, pooling, placed, embeddings, decoding, merged)
    engine = Engine(local.path, options)
    engine.template_override = brought.template
    if engine.gpu_notice and on_notice:
        on_notice(engine.gpu_notice)
    strategy = PLAIN if embeddings else strategy_for(engine, decoding, ctx_limit=n_ctx, source=source)
    return Loaded(engine=engine, name=local.path.name if local.source == "path" else local.ref, sampling=merged,
                  system=brought.system, decoding=decoding, strategy=strategy, defaults=defaults, messages=brought.messages,
                  brought=brought)


def _context(n_ctx: int, parallel: int, batch: int, threads, layers, flash_attn, kv_type: str, pooling, placed: dict,
             embeddings: bool, decoding: DecodeOptions, merged: SamplingOptions) -> LoadOptions:
    """The context's options for `n_ctx` tokens per slot (checked: a bad value raises here)."""
    if embeddings:  # one pool of cells for every text of a batch; a text must fit one batch
        options = LoadOptions(
            n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads, gpu_layers=layers, flash_attn=flash_attn,
            kv_type=kv_type, n_seq_max=EMBED_SEQUENCES, kv_unified=True, embeddings=True, pooling=pooling, **placed,
        )
    else:
        # Several sequences (the server's slots): each gets the context asked for, in its own KV stream.
        # Not one unified pool: there a sequence's cells interleave with the others', attention sums run in
        # another order, and greedy output would depend on what else is in the batch. A step asks for one
        # row of logits per sequence (a strategy asks for more: context_options).
        options = LoadOptions(
            n_ctx=n_ctx * parallel, n_batch=batch, n_ubatch=batch, n_threads=threads, gpu_layers=layers,
            flash_attn=flash_attn, kv_type=kv_type, n_seq_max=parallel, n_outputs=parallel, **placed,
        )
        if decoding.beams > 1:
            given = [flag for flag, on in (("--grammar", merged.grammar is not None), ("--json-schema", merged.json_schema is not None),
                                           ("--min-tokens", merged.min_tokens > 0)) if on]
            if given:  # beam search ranks whole sequences by log-probability; it has no sampler chain to constrain
                raise UsageError(f"--beams cannot combine with {' or '.join(given)}: drop one of them")
        answer_room = min(n_ctx, merged.max_tokens) if merged.max_tokens > 0 else n_ctx
        options = context_options(decoding, options, answer_room)
    return options


EMBED_SEQUENCES = 16  # texts embedded per decode (an embeddings context's sequences)


FALLBACK_CONTEXT = 4096  # where nothing better is known (no trained length, no memory to size by)
CONTEXT_CAP = 32768  # the largest default: a longer context is asked for (--ctx, num_ctx), not given unasked


def context_for(ctx: Optional[int], brought, path, parallel: int = 1, kv_type: str = "f16", *, embeddings: bool = False) -> int:
    """A slot's context: the one asked for (--ctx, num_ctx), else the one the model brings (its catalogue
    entry, a Modelfile's num_ctx), else sized for the model at `path` by default_context (an embeddings
    context and a model not read yet, `path` None: FALLBACK_CONTEXT)."""
    if ctx is not None:
        return ctx
    if brought.context:
        return brought.context
    if embeddings or path is None:
        return FALLBACK_CONTEXT
    from ..engine.gguf_info import read_info

    return default_context(read_info(path), parallel, kv_type)


def default_context(info, parallel: int = 1, kv_type: str = "f16", available: Optional[int] = None) -> int:
    """A model's context per slot when neither the request nor the catalogue names one (as Ollama sizes its
    default from the memory it has): the trained length up to CONTEXT_CAP, halved while the KV cache of
    `parallel` slots would take more than a quarter of the memory free now (`available`); never below
    FALLBACK_CONTEXT, nor above the trained length."""
    from ..engine.gguf_info import kv_cache_bytes

    trained = info.context_length or FALLBACK_CONTEXT
    floor = min(trained, FALLBACK_CONTEXT)
    if available is None:
        from .pool import available_memory

        available = available_memory()
    n_ctx = min(trained, CONTEXT_CAP)
    while n_ctx > floor and kv_cache_bytes(info, n_ctx * parallel, kv_type) > available // 4:
        n_ctx //= 2
    return max(n_ctx, floor)


def check_slots(batch: int, parallel: int) -> None:
    """--batch and --parallel: each step decodes one token per sequence, so the batch holds them all."""
    if batch < 1:
        raise SettingError("batch", batch, "use 1 or more")
    if parallel < 1:
        raise SettingError("parallel", parallel, "use 1 or more")
    if parallel > batch:
        raise SettingError("parallel", parallel, f"each step decodes a token of every sequence: the batch ({batch}) must hold at least {parallel}")


def strategy_for(engine: Engine, decoding: DecodeOptions, *, ctx_limit: int, source: str = "auto"):
    """The strategy `decoding` asks for on this engine, loading the draft model it names. On failure the
    engine is closed too (it was loaded for this strategy)."""
    from .. import hub

    draft = None
    try:
        if decoding.draft not in (None, "lookup"):
            draft = load_draft(engine, hub.ensure_local(decoding.draft, source=source).path)
        return make_strategy(decoding, engine, draft, ctx_limit=ctx_limit)
    except BaseException:
        if draft is not None:
            draft.close()
        engine.close()
        raise
