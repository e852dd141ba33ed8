"""Loading a model for generation: resolve the reference (pulling it if needed), check every option before
llama.cpp sees the file, load it with its decoding strategy, and keep its catalogue defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..engine import DecodeOptions, Engine, LoadOptions, SamplingOptions, merge_options
from ..engine.llama import CpuLoad, busy_advice
from ..engine.strategies import PLAIN, load_draft, make_strategy
from ..errors import SettingsConflict, UsageError
from .memory import CONTEXT_CAP, capped_context, context_for, default_context  # noqa: F401 - (their old home)
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
    template_defaults: Any = None  # runtime.request.TemplateDefaults: what the server gives requests that say nothing

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
    from ..engine.gguf_info import read_info  # (here: it loads llama.cpp's library, which a server waits for until a load)
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
        given = [setting for setting, on in (("grammar", merged.grammar is not None), ("json_schema", merged.json_schema is not None),
                                             ("min_tokens", merged.min_tokens > 0)) if on]
        if given:  # beam search ranks whole sequences by log-probability; it has no sampler chain to constrain
            raise SettingsConflict(("beams", *given), "drop one of them")

    def options_for(n_ctx: int, sliding: bool = False) -> LoadOptions:  # checked: a bad value raises here
        return spec.engine_options(n_ctx, decoding, answer_room=min(n_ctx, merged.max_tokens) if merged.max_tokens > 0 else n_ctx,
                                   sliding=sliding)

    options_for(context_for(spec.ctx, brought, None, embeddings=embeddings))
    local = hub.ensure_local(model, source=source)  # (every option was checked first: nothing is pulled for a bad one)
    check_adapters(spec.lora, local.path)
    if embeddings and spec.pooling == "rank":  # a reranker's load (runtime.rerank): no other model ranks
        from ..engine.rerank import check_reranker_file

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
