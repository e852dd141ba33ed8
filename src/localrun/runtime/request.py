"""The one request: what to answer (chat messages, plain text, or token ids), how to sample, what happens when
it does not fit, and the session it continues; and the prompt tokens it becomes for a given engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from ..engine import Engine, SamplingOptions
from ..engine.kv import extend_tokens
from ..engine.prompt import Rendered, render
from ..engine.vision import MARKER, Image
from ..errors import ContextOverflow, Phrase, UsageError


@dataclass
class Request:
    """What run, chat, serve and bench ask of a model. The response stream is engine.Response."""

    messages: list[dict] = field(default_factory=list)  # chat messages, or one user message for plain text
    raw: Optional[bool] = False  # True: the text goes to the model as-is, no template; None: so if the model has none
    tokens: Optional[list[int]] = None  # token ids as the prompt (instead of messages)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    truncate: bool = False  # keep the end of a prompt that does not fit, rather than refuse it
    # A conversation that does not leave the answer its room keeps its system prompt and newest messages, the
    # oldest dropped (as Ollama's /api/chat and chat do: _drop_oldest); still too long with its last message
    # alone, it is refused.
    drop_oldest: bool = False
    session: Optional[str] = None  # continue this named session (its KV state restored, saved after)
    system: Optional[str] = None  # the system prompt: None keeps a session's own, or else the model's default
    use_cache: bool = True  # look up and fill the automatic prefix cache
    tools: Optional[list[dict]] = None
    think: Optional[bool] = None  # a reasoning model: thinking on or off where its template has a switch
    template_kwargs: dict = field(default_factory=dict)  # more for the template: reasoning_effort, chat_template_kwargs
    reasoning: str = "auto"  # auto: a reasoning model's thinking apart from the answer; none: left inline
    top_logprobs: Optional[int] = None  # each token's log-probability and that many alternatives' (server slots)
    # At most this many tokens drafted a step by prompt lookup where the model drafts (a server's slots); 0: this
    # request decodes plainly. None: the model's own draft-max. In-process the run's --draft/--draft-max decide.
    draft_max: Optional[int] = None
    # Ollama's (deprecated) generate `context`: an earlier prompt and answer as tokens, put before this prompt
    context: Optional[list[int]] = None
    # The LoRA scales it is answered under, one per adapter the model was loaded with (runtime.lora.request_scales
    # makes them from llama-server's per-request `lora`); None: the model's own. No reload: the adapters are loaded.
    lora: Optional[tuple[float, ...]] = None
    # The tokens of an earlier prompt and its answer as the model read and wrote them, and the text they spell
    # (chat's last turn): a prompt whose text goes on from that text keeps those tokens and tokenizes only the rest,
    # as llama-cli does (tokenized again, an answer may split differently from how it was generated, and the KV
    # cache would be reused only up to there).
    extends: Optional[tuple[list[int], str]] = None


# The reasoning efforts a template may be given (gpt-oss reads low, medium, high; "none": no thinking, as llama.cpp takes it)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class TemplateDefaults:
    """What a server gives every chat request that does not say otherwise (llama-server's --reasoning,
    --reasoning-effort and --chat-template-kwargs): thinking on or off, the effort the template reads, more for the
    template. A request's own settings win, key by key."""

    think: Optional[bool] = None  # None: the template's default (auto)
    effort: Optional[str] = None
    kwargs: dict = field(default_factory=dict)


@dataclass
class Prompt:
    tokens: list[int]
    stops: list[str]  # what the prompt's format needs on top of the request's (a transcript's next "User:")
    templated: bool
    # A chat template's family (engine.formats): its thinking markers (or None), the prompt's tail after the assistant's
    # header (where the answer's splitter starts: an opened thinking block), and the special tokens its answer shows
    thinking: Optional[tuple] = None
    dropped: int = 0  # the oldest messages left out so that the conversation fits (Request.drop_oldest)
    messages: Optional[list[dict]] = None  # the messages it renders (the request's, less those dropped)
    text: str = ""  # the text it renders (an image as engine.vision.MARKER)

    def splitter(self, sampling=None):
        """A fresh engine.thinking.ThinkingSplitter for the answer to this prompt sampled with `sampling`, or None."""
        from ..engine.thinking import splitter_for

        return splitter_for(self.thinking, sampling)


def prompt_for(engine: Engine, request: Request, n_ctx: Optional[int] = None) -> Prompt:
    """The request's prompt tokens for this engine, fitted to `n_ctx` (default: the engine's context). With
    `drop_oldest` a conversation that leaves the answer too little room loses its oldest messages (_drop_oldest).
    With `truncate` a prompt over the context keeps its end; with the chat template it is the start of the last
    message that goes, so the template's head (its system prompt, earlier turns, the role markers) stays
    intact rather than being cut mid-way. A prompt with images is never cut (a part of an image means nothing)."""
    n_ctx = n_ctx or engine.n_ctx
    if request.tokens is not None:
        return Prompt(_fit(engine, list(request.tokens), request.truncate, request.sampling.max_tokens, n_ctx), [], False)
    images = any(m.get("images") for m in request.messages)
    if images:
        from .images import NoProjector, projector_for

        if projector_for(engine) is None:
            raise NoProjector(engine.path.name, marked(request.messages)[1][0].name)
    rendered, tokens = _tokenized(engine, request, request.messages)
    thinking = _thinking(engine, rendered, request)
    if request.context and not images:  # after the earlier exchange, which began the text (its BOS, where the model has one)
        tokens = [*request.context, *engine.tokenize(rendered.text, add_special=False, parse_special=True)]
        # a chain grown past the context keeps its end with truncate (Ollama's default), as any prompt does
        return Prompt(_fit(engine, tokens, request.truncate, request.sampling.max_tokens, n_ctx), rendered.stops, rendered.templated, thinking,
                      messages=request.messages, text=rendered.text)
    if request.drop_oldest and len(tokens) > kept_room(n_ctx, request.sampling.max_tokens):
        fitted = _drop_oldest(engine, request, n_ctx, len(tokens))
        if fitted is not None and (len(fitted[2]) < n_ctx or not request.truncate or images):
            kept, rendered, tokens = fitted  # (over the context even so: refused with its own count, or cut below)
            return Prompt(_fit(engine, tokens, False, request.sampling.max_tokens, n_ctx), rendered.stops, rendered.templated,
                          _thinking(engine, rendered, request), dropped=len(request.messages) - len(kept), messages=kept,
                          text=rendered.text)
    if images or not (request.truncate and rendered.templated) or len(tokens) < n_ctx or not request.messages:
        return Prompt(_fit(engine, tokens, request.truncate and not images, request.sampling.max_tokens, n_ctx), rendered.stops,
                      rendered.templated, thinking, messages=request.messages, text=rendered.text)
    keep = prompt_room(n_ctx, request.sampling.max_tokens)
    last = request.messages[-1]
    body = engine.tokenize(last["content"], add_special=False, parse_special=False)
    excess = len(tokens) - keep + 8  # a few tokens' margin: text re-tokenizes a little differently at the cut
    if excess < len(body):
        shortened = [*request.messages[:-1], {**last, "content": engine.detokenize(body[excess:])}]
        text = render(engine, shortened, tools=request.tools, think=request.think, kwargs=request.template_kwargs).text
        cut = engine.tokenize(text, add_special=True, parse_special=True)
        if len(cut) <= keep:
            return Prompt(cut, rendered.stops, True, thinking, messages=shortened, text=text)
    # The template and earlier turns alone overflow: keep the end, as for plain text.
    return Prompt(_fit(engine, tokens, True, request.sampling.max_tokens, n_ctx), rendered.stops, True, thinking)


def _tokenized(engine: Engine, request: Request, messages: list[dict]) -> tuple[Rendered, list[int]]:
    """`messages` rendered as the request asks, and their tokens: a message's images (engine.vision.Image, in order)
    as a marker each in the text, then as the projector's tokens for them; what goes on from `request.extends`
    keeps its tokens."""
    shown, images = marked(messages)
    rendered = render(engine, shown, raw=request.raw, tools=request.tools, think=request.think, kwargs=request.template_kwargs)
    known, known_text = request.extends or ([], "")
    if not images:
        return rendered, extend_tokens(known, known_text, rendered.text, engine.tokenize)
    if known and rendered.text.startswith(known_text):  # only the new part: its images are the last ones
        new = images[known_text.count(MARKER):]
        return rendered, [*known, *_continued(engine, rendered.text[len(known_text):], new)]
    return rendered, engine.vision.tokenize(rendered.text, images)


def _continued(engine: Engine, text: str, images: Sequence[Image]) -> list[int]:
    """`text` with one MARKER per image as the continuation of a prompt (no BOS, each piece of text tokenized as
    extend_tokens tokenizes it)."""
    pieces = text.split(MARKER)
    if len(pieces) - 1 != len(images):
        raise UsageError(f"the conversation has {len(pieces) - 1} image markers ({MARKER}) for {len(images)} images:"
                         f" leave {MARKER} out of the text")
    tokens = engine.tokenize(pieces[0], add_special=False, parse_special=True)
    for image, piece in zip(images, pieces[1:]):
        tokens.extend(engine.vision.image_tokens(image))
        if piece:
            tokens.extend(engine.tokenize(piece, add_special=False, parse_special=True))
    return tokens


def marked(messages: Sequence[dict]) -> tuple[list[dict], list[Image]]:
    """The messages as the template renders them (a message's images as engine.vision.MARKERs before its text, as
    llama.cpp's mtmd-cli places them) and their images in order."""
    images = [image for m in messages for image in m.get("images") or ()]
    if not images:
        return list(messages), []
    return [{k: v for k, v in m.items() if k != "images"} | {"content": MARKER * len(m["images"]) + (m.get("content") or "")}
            if m.get("images") else m for m in messages], images


def _drop_oldest(engine: Engine, request: Request, n_ctx: int, n_all: int) -> Optional[tuple[list[dict], Rendered, list[int]]]:
    """(the messages kept, as rendered, their tokens) for a conversation of `n_all` tokens that leaves the answer less
    than its room (kept_room): its system messages and its newest messages, dropped oldest first,
    starting at a user's message (templates that check the turns alternate accept it); None when there is nothing to
    drop.

    The one policy for every caller (chat, and Ollama's /api/chat, whose clients send the whole conversation each
    time): the oldest messages go in blocks of at least half the prompt's room, counted from the conversation's first
    message. A block's bounds depend only on the messages in it, so the next request keeps the same first message
    until the conversation has grown by half the room again: its prompt extends the last one and the KV cache's
    prefix is reused (dropping just what fits would move the start every turn once the context is full, and every
    turn would evaluate the whole conversation again). Chat forgets what was dropped, and its blocks are counted
    from there: the same bounds. When no block bound fits, the fewest messages past the last one are dropped; when
    nothing does, the last message is kept alone (the caller refuses it, or cuts it, where it is over the context)."""
    messages = request.messages
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    starts = [i for i, m in enumerate(messages) if i > first and m["role"] == "user"]
    if len(messages) - 1 > first and (not starts or starts[-1] != len(messages) - 1):
        starts.append(len(messages) - 1)
    keep = kept_room(n_ctx, request.sampling.max_tokens)
    bound, fewest, fitted = n_all, None, None  # the tokens kept from the last block's bound on (at first: all)
    for start in starts:
        kept = [m for m in messages[:start] if m["role"] == "system"] + messages[start:]
        rendered, tokens = _tokenized(engine, request, kept)
        fitted = kept, rendered, tokens
        if bound - len(tokens) >= keep // 2:  # a block's bound
            bound, fewest = len(tokens), None
            if len(tokens) <= keep:
                return fitted
        elif fewest is None and len(tokens) <= keep:
            fewest = fitted
    return fewest or fitted


def _thinking(engine: Engine, rendered, request: Request) -> Optional[tuple]:
    """(thinking markers or None, whether the prompt opened the block, the special tokens the answer must show)
    for a templated prompt whose family thinks apart from its answer or writes markers in special tokens
    (engine.formats); None for plain text."""
    from ..engine.formats import family_for, prompt_tail

    if not rendered.templated:
        return None
    family = family_for(engine.chat_template)
    markers = family.thinking if request.reasoning != "none" else None
    if markers is None and not family.preserved:
        return None
    # the prompt's text after the assistant's header (an opened thinking block, a prefilled answer): the answer's
    # splitter goes on from there
    return markers, prompt_tail(engine.chat_template, rendered.text, family) if markers is not None else "", family.preserved


def _fit(engine: Engine, tokens: list[int], truncate: bool, max_tokens: int, n_ctx: int) -> list[int]:
    """The prompt's tokens as they go to the model: whole, or with --truncate their end (BOS kept)."""
    if len(tokens) < n_ctx:
        return tokens
    if not truncate:
        engine.check_fits(len(tokens), n_ctx)  # raises with both numbers
    keep = prompt_room(n_ctx, max_tokens)
    head = tokens[:1] if engine.info.bos_token_id is not None and tokens[0] == engine.info.bos_token_id else []
    return head + tokens[len(tokens) - keep + len(head) :]


def prompt_room(n_ctx: int, max_tokens: int) -> int:
    """How much of the context a truncated prompt, or a conversation that drops its oldest messages, may keep: the
    rest is room for the answer (at most half)."""
    room = min(max_tokens if max_tokens > 0 else n_ctx // 2, n_ctx // 2)
    keep = n_ctx - room
    if keep < 1:
        raise ContextOverflow(Phrase("the context of {n_ctx} tokens leaves no room for the prompt: raise {ctx}", n_ctx=n_ctx))
    return keep


def kept_room(n_ctx: int, max_tokens: int) -> int:
    """How much of the context a conversation may keep before it drops its oldest messages: the rest is room for the
    answer, `max_tokens` where the request names it, else a quarter of the context (at most half). Not a truncated
    prompt's half: a conversation kept whole up to three quarters of its context, as chat always kept it, and as
    Ollama's clients, whose conversations Ollama keeps up to the whole context, lose less of it."""
    return n_ctx - min(max_tokens if max_tokens > 0 else n_ctx // 4, n_ctx // 2)


def with_stops(sampling: SamplingOptions, stops: Sequence[str]) -> SamplingOptions:
    """The request's options plus the stops its prompt format needs."""
    extra = [s for s in stops if s not in sampling.stop]
    return sampling.model_copy(update={"stop": [*sampling.stop, *extra]}) if extra else sampling


def with_system(request: Request, default: Optional[str], history: Sequence[dict] = (), preset: Sequence[dict] = ()) -> list[dict]:
    """The request's messages after a session's `history`, with its system prompt: `request.system` replaces
    the history's own; a new conversation without a system message gets `default` (the catalogue's), and
    the model's `preset` first messages (a Modelfile's MESSAGEs, as Ollama puts them before every
    conversation). A prompt without a template (raw) gets neither."""
    templated = not request.raw
    if history:
        messages = list(history)
        if request.system is not None and templated:
            messages = [m for m in messages if m["role"] != "system"]
            if request.system:
                messages.insert(0, {"role": "system", "content": request.system})
        return messages + list(request.messages)
    system = request.system if request.system is not None else default
    messages = list(request.messages)
    if templated and preset:
        at = 1 if messages and messages[0]["role"] == "system" else 0
        messages[at:at] = [dict(m) for m in preset]
    if system and templated and not any(m["role"] == "system" for m in messages):
        return [{"role": "system", "content": system}, *messages]
    return messages
