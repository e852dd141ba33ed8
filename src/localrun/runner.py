"""From a request (text or messages + options) to a stream of answer text, with stops applied.

Shared by `run`, `chat` and (later) `serve`: builds the prompt with the model's chat template,
fits it in the context, drives Engine.generate and cuts stop sequences out of the stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Optional

from .engine import Done, Engine, Stats, Token
from .errors import ContextOverflow
from .sampling import SamplingOptions
from .stops import StopMatcher


@dataclass
class Request:
    messages: list[dict] = field(default_factory=list)  # chat messages, or one user message for run
    raw: bool = False  # True: the text goes to the model as-is, no template
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    truncate: bool = False


@dataclass
class Piece:
    text: str


@dataclass
class Finished:
    stats: Stats
    text: str
    tokens: list[int]
    stopped_by: Optional[str] = None


def render_prompt(engine: Engine, request: Request) -> str:
    if request.raw or engine.chat_template is None:
        return "\n\n".join(m["content"] for m in request.messages if m["role"] != "system" or request.raw)
    return engine.apply_chat_template(request.messages, add_generation_prompt=True)


def _fit(engine: Engine, tokens: list[int], truncate: bool, max_tokens: int) -> list[int]:
    """The prompt's tokens as they go to the model: whole, or with --truncate their end (BOS kept)."""
    if len(tokens) < engine.n_ctx:
        return tokens
    if not truncate:
        engine.check_fits(len(tokens))  # raises with both numbers
    keep = _prompt_room(engine, max_tokens)
    head = tokens[:1] if engine.info.bos_token_id is not None and tokens[0] == engine.info.bos_token_id else []
    return head + tokens[len(tokens) - keep + len(head) :]


def _prompt_room(engine: Engine, max_tokens: int) -> int:
    """How much of the context a truncated prompt may keep: the rest is room for the answer (at most half)."""
    room = min(max_tokens if max_tokens > 0 else engine.n_ctx // 2, engine.n_ctx // 2)
    keep = engine.n_ctx - room
    if keep < 1:
        raise ContextOverflow(f"the context of {engine.n_ctx} tokens leaves no room for the prompt: raise --ctx")
    return keep


def request_tokens(engine: Engine, request: Request) -> list[int]:
    """The request's prompt tokens. With --truncate a prompt over the context keeps its end; with the chat
    template it is the start of the last message that goes, so the template's head (its system prompt,
    earlier turns, the role markers) stays intact rather than being cut mid-way."""
    tokens = engine.tokenize(render_prompt(engine, request), add_special=True, parse_special=True)
    templated = not request.raw and engine.chat_template is not None
    if not (request.truncate and templated) or len(tokens) < engine.n_ctx or not request.messages:
        return _fit(engine, tokens, request.truncate, request.sampling.max_tokens)
    keep = _prompt_room(engine, request.sampling.max_tokens)
    last = request.messages[-1]
    body = engine.tokenize(last["content"], add_special=False, parse_special=False)
    excess = len(tokens) - keep + 8  # a few tokens' margin: text re-tokenizes a little differently at the cut
    if excess < len(body):
        shortened = Request(messages=[*request.messages[:-1], {**last, "content": engine.detokenize(body[excess:])}],
                            raw=request.raw, sampling=request.sampling, truncate=True)
        cut = engine.tokenize(render_prompt(engine, shortened), add_special=True, parse_special=True)
        if len(cut) <= keep:
            return cut
    # The template and earlier turns alone overflow: keep the end, as for plain text.
    return _fit(engine, tokens, True, request.sampling.max_tokens)


def stream_tokens(engine: Engine, tokens: Sequence[int], sampling: SamplingOptions) -> Iterator[Piece | Finished]:
    matcher = StopMatcher(sampling.stop)
    answer: list[str] = []
    ids: list[int] = []
    gen = engine.generate(tokens, sampling)
    stats = None
    try:
        for event in gen:
            if isinstance(event, Token):
                if event.token_id >= 0:
                    ids.append(event.token_id)
                out = matcher.feed(event.text)
                if out:
                    answer.append(out)
                    yield Piece(out)
                if matcher.stopped is not None:
                    break
            elif isinstance(event, Done):
                stats = event.stats
                if not ids:  # beam search streams its best beam as one piece of text: its ids come here
                    ids.extend(event.tokens)
                out = matcher.flush()  # may still find a stop in the text it held back
                if out:
                    answer.append(out)
                    yield Piece(out)
    finally:
        gen.close()
    if stats is None:
        stats = engine.last_stats  # closed early by a stop sequence: the engine kept its stats
    if matcher.stopped is not None:
        stats.finish_reason = "stop"
    yield Finished(stats, "".join(answer), ids, stopped_by=matcher.stopped)


def read_prompt(args: Sequence[str], stdin) -> str:
    """Piped stdin first, then the argument words (as Ollama does); an empty result is a usage error."""
    from .errors import UsageError

    parts = []
    if stdin is not None and not stdin.isatty():
        try:
            piped = stdin.read()
            piped.encode("utf-8")  # undecodable bytes arrive as lone surrogates, which cannot go on
        except (UnicodeDecodeError, UnicodeEncodeError):
            raise UsageError("stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)") from None
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if args and " ".join(args).strip():  # an empty argument ('') is no prompt
        parts.append(" ".join(args))
    if not parts:
        raise UsageError("no prompt: pass it as an argument or pipe it on stdin (or use `localrun chat`)")
    return "\n\n".join(parts)


@dataclass
class Loaded:
    """A model ready to generate: its engine, its catalogue defaults and the merged sampling options."""

    engine: Engine
    name: str
    sampling: SamplingOptions
    system: Optional[str]

    @property
    def ref(self) -> str:
        """What loads this model again: its alias or owner/repo, or for a file given by path the full path
        (a session's "resume it with ..." hint named the bare file name, which does not load)."""
        return str(self.engine.path) if self.name == self.engine.path.name else self.name


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
    sampling_flags: Optional[dict] = None,
    logit_bias: Sequence[str] = (),
    stop: Sequence[str] = (),
    grammar=None,
    json_schema=None,
    on_notice=None,
    parallel: int = 1,
    decoding=None,
) -> Loaded:
    """Resolve `model` (pulling it if needed), validate every option, then load llama.cpp."""
    from . import hub
    from .config import entry_for
    from .engine import LoadOptions, parse_gpu_layers
    from .errors import UsageError
    from .sampling import build_options, parse_logit_bias, read_grammar, read_json_schema

    entry = entry_for(model)
    overrides = dict(sampling_flags or {})
    overrides["logit_bias"] = parse_logit_bias(list(logit_bias)) or None
    overrides["stop"] = list(stop) or None
    overrides["grammar"] = read_grammar(grammar)
    overrides["json_schema"] = read_json_schema(json_schema)
    sampling = build_options(entry.sampling if entry else {}, overrides)
    layers = parse_gpu_layers(gpu_layers)
    if batch < 1:
        raise UsageError(f"invalid --batch {batch}: use 1 or more")
    n_ctx = ctx if ctx is not None else (entry.context if entry else 4096)
    if parallel < 1:
        raise UsageError(f"invalid --parallel {parallel}: use 1 or more")
    if parallel > batch:
        raise UsageError(f"--parallel {parallel} needs --batch of at least {parallel} (one token per sequence per step)")
    # Several sequences (the server's slots): each gets the context asked for, in its own KV stream.
    # Not one unified pool: there a sequence's cells interleave with the others', attention sums run in
    # another order, and greedy output would depend on what else is in the batch.
    options = LoadOptions(
        n_ctx=n_ctx * parallel, n_batch=batch, n_ubatch=batch, n_threads=threads, gpu_layers=layers,
        flash_attn=flash_attn, kv_type=kv_type, n_seq_max=parallel,
    )
    if decoding is not None and decoding.beams > 1:
        given = [flag for flag, on in (("--grammar", sampling.grammar is not None), ("--json-schema", sampling.json_schema is not None),
                                       ("--min-tokens", sampling.min_tokens > 0)) if on]
        if given:  # beam search ranks whole sequences by log-probability; it has no sampler chain to constrain
            raise UsageError(f"--beams cannot combine with {' or '.join(given)}: drop one of them")
    if decoding is not None:
        from .decoding import context_options

        answer_room = min(n_ctx, sampling.max_tokens) if sampling.max_tokens > 0 else n_ctx
        options = context_options(decoding, options, answer_room)
    local = hub.ensure_local(model, source=source)
    engine = Engine(local.path, options)
    if engine.gpu_notice and on_notice:
        on_notice(engine.gpu_notice)
    if decoding is not None:
        from .decoding import attach

        try:
            attach(engine, decoding, ctx_limit=n_ctx, source=source)
        except Exception:
            engine.close()
            raise
    return Loaded(engine=engine, name=local.path.name if local.source == "path" else local.ref, sampling=sampling, system=entry.system if entry else None)


def build_request(
    loaded: Loaded, text: str, *, system: Optional[str], raw: bool, truncate: bool, on_notice=None,
    history: Sequence[dict] = (),
) -> Request:
    if not raw and loaded.engine.chat_template is None:
        raw = True
        if on_notice:
            on_notice(f"{loaded.name} has no chat template (a base model): running plain completion")
    messages = list(history)
    sys_prompt = system if system is not None else loaded.system
    if sys_prompt and not raw and not messages:
        messages.append({"role": "system", "content": sys_prompt})
    elif system is not None and not raw and messages:  # a resumed session: --system replaces its own, as in chat
        messages = [m for m in messages if m["role"] != "system"]
        if system:
            messages.insert(0, {"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return Request(messages=messages, raw=raw, sampling=loaded.sampling, truncate=truncate)


def answer(
    loaded: Loaded, text: str, *, system: Optional[str], raw: bool, truncate: bool,
    session: Optional[str] = None, use_cache: bool = True, on_notice=None,
) -> Iterator[Piece | Finished]:
    """One `run`: continue a named session (its KV state restored from disk, saved again after), or
    else look up the automatic prefix cache before prefilling and store the result after."""
    from .errors import SessionError
    from .sessions import SessionStore, check_name

    engine = loaded.engine
    store = None
    if session:
        store = SessionStore.open()
    elif use_cache:
        store = _optional_cache(SessionStore.open, on_notice)
        use_cache = store is not None
    history: list[dict] = []
    if session:
        check_name(session)
        try:
            store.show(session)
        except SessionError:
            pass  # a new session: created after this answer
        else:
            history = store.load(session, engine)
    request = build_request(loaded, text, system=system, raw=raw, truncate=truncate, on_notice=on_notice, history=history)
    tokens = request_tokens(engine, request)
    if store is not None and use_cache and not session:
        _optional_cache(lambda: store.lookup_prefix(engine, tokens, on_notice=on_notice), on_notice)
    finished = None
    for event in stream_tokens(engine, tokens, request.sampling):
        if isinstance(event, Finished):
            finished = event
        yield event
    if finished is None or store is None:
        return
    if session:
        messages = request.messages + [{"role": "assistant", "content": finished.text}]
        store.save(session, engine, messages, model_ref=loaded.ref)
    elif use_cache:
        _optional_cache(lambda: store.save_prefix(engine), on_notice)


def _optional_cache(action, on_notice):
    """The prefix cache only saves time: when its index is damaged, say so once and answer without it."""
    import sqlite3

    from .errors import SessionError

    try:
        return action()
    except (SessionError, sqlite3.DatabaseError) as exc:
        if on_notice:
            on_notice(f"prefix cache skipped: {getattr(exc, 'message', exc)}")
        return None
