"""Loading a model for generation: resolve the reference (pulling it if needed), check every option before
llama.cpp sees the file, load it with its decoding strategy, and keep its catalogue defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..engine import DecodeOptions, Engine, LoadOptions, SamplingOptions, merge_options
from ..engine.gguf_info import read_info
from ..engine.llama import CpuLoad, busy_advice
from ..engine.strategies import PLAIN, load_draft, make_strategy
from ..errors import UsageError
from .options import FALLBACK_CONTEXT, LoadSpec, has_sliding_window


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
    capped: Optional[str] = None  # the context asked for was past the trained length: what each request is told
    busy: Optional[str] = None  # other processes took cores while it loaded: the advice (engine.llama.busy_advice)

    @property
    def ref(self) -> str:
        """What loads this model again: its alias or owner/repo, or for a file given by path the full path
        (a session's "resume it with ..." hint named the bare file name, which does not load)."""
        return str(self.engine.path) if self.name == self.engine.path.name else self.name

    def close(self) -> None:
        self.strategy.close()
        self.engine.close()


def load(model: str, spec: LoadSpec = LoadSpec(), *, source: str = "auto", sampling: Optional[dict[str, Any]] = None,
         on_notice=None) -> Loaded:
    """Resolve `model` (pulling it if needed), validate every option, then load llama.cpp with `spec`.
    `sampling`: the request's sampling values (None = not given), merged over the catalogue's defaults. An
    embeddings context (spec.kind "embed", runtime.embed): `ctx` tokens, any text up to that long in one
    batch, and EMBED_SEQUENCES texts per decode sharing them."""
    from dataclasses import replace

    from .. import hub
    from ..engine.lora import read_adapter
    from .lora import check_adapters

    brought = hub.defaults_for(model)
    # A created model's adapters (its Modelfile's ADAPTER lines) first, then those the load adds (--lora): each a
    # LoRA GGUF, checked before anything is pulled, and against the model before it loads.
    spec = replace(spec, lora=tuple(brought.adapters) + tuple(spec.lora)) if brought.adapters else spec
    for path, _ in spec.lora:
        read_adapter(path)
    defaults = dict(brought.sampling)
    merged = merge_options(defaults, sampling)
    embeddings = spec.kind == "embed"
    decoding = spec.decoding(None if embeddings else brought.draft)  # a code model's default
    if decoding.beams > 1:
        given = [flag for flag, on in (("--grammar", merged.grammar is not None), ("--json-schema", merged.json_schema is not None),
                                       ("--min-tokens", merged.min_tokens > 0)) if on]
        if given:  # beam search ranks whole sequences by log-probability; it has no sampler chain to constrain
            raise UsageError(f"--beams cannot combine with {' or '.join(given)}: drop one of them")

    def options_for(n_ctx: int, sliding: bool = False) -> LoadOptions:  # checked: a bad value raises here
        return spec.engine_options(n_ctx, decoding, answer_room=min(n_ctx, merged.max_tokens) if merged.max_tokens > 0 else n_ctx,
                                   sliding=sliding)

    options_for(context_for(spec.ctx, brought, None, embeddings=embeddings))
    local = hub.ensure_local(model, source=source)  # (every option was checked first: nothing is pulled for a bad one)
    check_adapters(spec.lora, local.path)
    if embeddings and spec.pooling == "rank":  # a reranker's load (runtime.rerank): no other model ranks
        from .rerank import check_reranker_file

        check_reranker_file(local.path, local.path.name if local.source == "path" else local.ref, brought.rerank)
    info = read_info(local.path)
    n_ctx = context_for(spec.ctx, brought, local.path, spec.kv_streams(info), spec.kv_type, embeddings=embeddings)
    options = options_for(n_ctx, has_sliding_window(info))
    capped = capped_context(spec.ctx, brought, info, local.path.name if local.source == "path" else local.ref)
    if capped and on_notice:
        on_notice(capped)
    machine = CpuLoad()
    engine = Engine(local.path, options)
    busy = busy_advice(machine.busy(), engine.n_threads)
    engine.template_override = brought.template
    if engine.gpu_notice and on_notice:
        on_notice(engine.gpu_notice)
    strategy = PLAIN if embeddings else strategy_for(engine, decoding, ctx_limit=n_ctx, source=source)
    return Loaded(engine=engine, name=local.path.name if local.source == "path" else local.ref, sampling=merged,
                  system=brought.system, decoding=decoding, strategy=strategy, defaults=defaults, messages=brought.messages,
                  brought=brought, capped=capped, busy=busy)


CONTEXT_CAP = 32768  # the largest default: a longer context is asked for (--ctx, num_ctx), not given unasked


def context_for(ctx: Optional[int], brought, path, streams: int = 1, kv_type: str = "f16", *, embeddings: bool = False) -> int:
    """The context one request may fill: the one asked for (--ctx, num_ctx), else the one the model brings
    (its catalogue entry, a Modelfile's num_ctx), at most the length the model at `path` was trained on
    (capped_context says so); else sized for it by default_context (an embeddings context and a model not read
    yet, `path` None: FALLBACK_CONTEXT)."""
    given = ctx if ctx is not None else brought.context
    if given:
        trained = read_info(path).context_length if path is not None else None
        return min(given, trained) if trained else given
    if embeddings or path is None:
        return FALLBACK_CONTEXT
    return default_context(read_info(path), streams, kv_type)


def capped_context(ctx: Optional[int], brought, info, name: str) -> Optional[str]:
    """What to tell a user whose context (--ctx, else the model's num_ctx) is past the length the model was
    trained on, which context_for gives instead, as Ollama caps it and says so; None when it is not."""
    trained = info.context_length
    given = ctx if ctx is not None else brought.context
    if not given or not trained or given <= trained:
        return None
    what = f"--ctx {given}" if ctx is not None else f"{name}'s num_ctx {given}"  # (a catalogue entry's context, a Modelfile's)
    return f"{what} is more than {name} was trained on ({trained} tokens): using {trained}"


def default_context(info, streams: int = 1, kv_type: str = "f16", available: Optional[int] = None) -> int:
    """A model's context when neither the request nor the catalogue names one (as Ollama sizes its default
    from the memory it has): the trained length up to CONTEXT_CAP, halved while its KV cache would take more
    than a quarter of the memory free now (`available`), for each of the context's KV `streams` (a server's
    slots keep one each, or one pool: LoadSpec.kv_streams); never below FALLBACK_CONTEXT, nor above the
    trained length."""
    from ..engine.gguf_info import kv_cache_bytes

    trained = info.context_length or FALLBACK_CONTEXT
    floor = min(trained, FALLBACK_CONTEXT)
    if available is None:
        from .pool import available_memory

        available = available_memory()
    n_ctx = min(trained, CONTEXT_CAP)
    while n_ctx > floor and kv_cache_bytes(info, n_ctx * streams, kv_type) > available // 4:
        n_ctx //= 2
    return max(n_ctx, floor)


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
