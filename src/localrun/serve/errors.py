"""Every refusal the HTTP layer answers, and the one table that turns it into a status, a code and the field at
fault (`fault`). What is refused is said with fields (`Refused` and its kinds; the runtime's own typed errors,
wrapped where they are met: a load, an embedding, a model made), never as a sentence for one interface: each
dialect names the fields as its clients wrote them (`Wording`) and shapes the body (OpenAI's, Anthropic's,
Ollama's), nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from ..errors import ContextOverflow, InvalidModelFile, LocalrunError, ModelNotFound, SettingError, UnknownModel, UsageError
from ..runtime import OptionError
from ..runtime.failures import flag
from ..runtime.images import BadImage, NoProjector
from ..runtime.options import LOAD_OPTIONS
from ..runtime.serving.pool import LoadCancelled, ModelTooBig, PoolBusy
from ..runtime.serving.scheduler import QueueFull, ServerStopping

STOPPING = "the server is shutting down: retry later"


class Refused(Exception):
    """A request refused: why (`reason`, a sentence that stands alone), the field at fault (in localrun's names, or
    as the client wrote it), the HTTP status and a code. `worded(name)` says it with the field named as the client's
    dialect names it."""

    status = 400

    def __init__(self, reason: str = "", field: Optional[str] = None, *, status: Optional[int] = None,
                 code: Optional[str] = None):
        super().__init__(reason or field)
        self.reason, self.field, self.code = reason, field, code
        if status is not None:
            self.status = status

    def worded(self, name: Optional[str]) -> str:
        return self.reason


class InvalidField(Refused):
    """A field whose value cannot be taken: `reason` says why."""

    def worded(self, name: Optional[str]) -> str:
        return f"invalid {name!r}: {self.reason}"


class UnknownField(Refused):
    def worded(self, name: Optional[str]) -> str:
        return f"unknown or unsupported field {name!r}"


class MissingField(Refused):
    def worded(self, name: Optional[str]) -> str:
        return f"missing required field {name!r}"


class Unsupported(Refused):
    """A feature localrun does not do, asked for by the field that asks it."""

    def worded(self, name: Optional[str]) -> str:
        return f"{name!r} is not supported by localrun serve: leave it out"


class TooLong(Exception):
    """A prompt over the slot's context (runtime's ContextOverflow), met where the field holding it is known."""

    def __init__(self, cause: ContextOverflow, field: str):
        super().__init__(cause.message)
        self.cause, self.field = cause, field


class PromptFailed(Exception):
    """A prompt that could not be made of the request for a reason no table knows (a chat template raising on
    these messages): the request's fault, said with the cause's own words."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class LoadFailed(Exception):
    """The pool could not give model `ref` (runtime.serving.pool.ModelPool.acquire): `cause` says why."""

    def __init__(self, cause: LocalrunError, ref: str):
        super().__init__(cause.message)
        self.cause, self.ref = cause, ref


class LoadRefused(Exception):
    """A request's load options (its `options`) that the server's slots cannot take: `cause` names the setting."""

    def __init__(self, cause: LocalrunError):
        super().__init__(cause.message)
        self.cause = cause


class EmbedFailed(Exception):
    """Embeddings that could not be made of a request's texts (runtime.embed): `cause` says why."""

    def __init__(self, cause: LocalrunError):
        super().__init__(cause.message)
        self.cause = cause


class MakeFailed(Exception):
    """A model that could not be shown, made, copied or deleted: `cause` says why; `missing`: how a model that is
    not there is said, where the request named it otherwise."""

    def __init__(self, cause: LocalrunError, missing: Optional[str] = None):
        super().__init__(cause.message)
        self.cause, self.missing = cause, missing


@dataclass(frozen=True)
class Wording:
    """How a dialect says what the table says: `name_of(field)` the field as its clients write it (localrun's names
    in, theirs out; a name already theirs stays), and its remedies: for a prompt over the context, for images on a
    model without a projector. `load_options`: the load settings its requests can set (named through name_of as
    `load.SETTING`); any other load setting is the server's own, named by its flag."""

    more_context: str
    no_projector: str
    name_of: Callable[[str], str] = str
    load_options: frozenset = frozenset()


@dataclass(frozen=True)
class Fault:
    """A refusal as every dialect's body is made of: the status, the message, the field at fault (as the client
    wrote it), a code, and for a prompt over the context its (prompt, context) tokens."""

    status: int
    message: str
    param: Optional[str] = None
    code: Optional[str] = None
    sizes: Optional[tuple[int, int]] = None

    @property
    def kind(self) -> str:
        """OpenAI's error type for the status."""
        if self.status in (413, 429):
            return {413: "request_too_large", 429: "rate_limit_error"}[self.status]
        return "server_error" if self.status >= 499 else "invalid_request_error"

    @property
    def headers(self) -> Optional[dict]:
        return {"Retry-After": "1"} if self.status in (429, 503) else None  # as every dialect's busy answer


# The load settings some dialect's requests set (runtime.options.LOAD_OPTIONS' fields)
LOAD_SETTINGS = frozenset(LOAD_OPTIONS.values())


def settings_named(w: Wording) -> Callable[[str], str]:
    """How a dialect names a setting an error's sentence names (errors.Phrase): a load setting its requests set as
    the option that sets it (options.num_ctx for Ollama), a load setting they cannot set as the server's flag ("the
    server's --parallel": no option of theirs changes it), any other as the field of that name."""
    def named(setting: str) -> str:
        if setting in w.load_options:
            return w.name_of(f"load.{setting}")
        if setting in LOAD_SETTINGS:
            return "the server's " + flag(setting)
        return w.name_of(setting)
    return named


def message_of(exc: LocalrunError, w: Wording) -> str:
    """A runtime error's message, the settings it names named by the dialect."""
    return exc.worded(settings_named(w))


def _refused(exc: Refused, w: Wording) -> Fault:
    name = w.name_of(exc.field) if exc.field else None
    return Fault(exc.status, exc.worded(name), name, exc.code)


def _too_long(exc: TooLong, w: Wording) -> Fault:
    # OpenAI's own words lead (clients such as litellm tell a context overflow by them, to trim or fall back)
    cause = exc.cause
    return Fault(400, f"This model's maximum context length is {cause.n_ctx} tokens (a slot's context), but the prompt is"
                      f" {cause.n_prompt} tokens: shorten it, or {w.more_context}", w.name_of(exc.field),
                 "context_length_exceeded", (cause.n_prompt, cause.n_ctx))


def _option(exc: OptionError, w: Wording) -> Fault:
    name = w.name_of(exc.field) if exc.field else None
    return Fault(400, f"invalid {name!r}: {exc.reason}" if exc.field else exc.reason, name)


def _setting(exc: SettingError, w: Wording) -> Fault:
    name = w.name_of(exc.setting) if exc.setting else None
    return Fault(400, exc.worded(w.name_of), name)


def _no_projector(exc: NoProjector, w: Wording) -> Fault:
    return Fault(400, f"{exc.image}: the model {exc.model} has no image projector: {w.no_projector}", exc.image,
                 "model_without_vision")


def _load_refused(exc: LoadRefused, w: Wording) -> Fault:
    cause = exc.cause
    if isinstance(cause, SettingError):  # the setting at fault named as the request set it, the others as any are
        others = settings_named(w)
        return Fault(400, cause.worded(lambda s: w.name_of(f"load.{s}") if s == cause.setting else others(s)),
                     w.name_of(f"load.{cause.setting}" if cause.setting else "load"))
    return Fault(400, message_of(cause, w), w.name_of("load"))  # e.g. an RPC endpoint or a tensor split: the server's own settings


# (the cause's type, status, code) of a model the pool could not give
_LOAD = ((ModelNotFound, 404, "model_not_found"), (ModelTooBig, 400, "model_too_big"), (PoolBusy, 503, "models_busy"),
         (LoadCancelled, 499, "cancelled"), (UsageError, 400, "invalid_options"), (InvalidModelFile, 400, "invalid_model_file"))


def _load_failed(exc: LoadFailed, w: Wording) -> Fault:
    cause = exc.cause
    status, code = next(((s, c) for kind, s, c in _LOAD if isinstance(cause, kind)), (500, "load_failed"))
    message = message_of(cause, w) if status != 500 else f"cannot load {exc.ref}: {message_of(cause, w)}"
    if isinstance(cause, UnknownModel):  # worded for an HTTP client, not the command line
        message = f"unknown model '{cause.name}': {cause.guess}GET /v1/models lists the models this server has"
    return Fault(status, message, w.name_of("load") if code == "invalid_options" else "model", code)


def _embed_failed(exc: EmbedFailed, w: Wording) -> Fault:
    cause = exc.cause
    if isinstance(cause, ContextOverflow):  # a text over the context, truncation off (OpenAI's, or Ollama's truncate: false)
        said = cause.message.split(":")[0]  # "text N is M tokens but the context holds C"
        return Fault(400, f"This model's maximum context length is {cause.n_ctx} tokens, but {said}: shorten it", "input",
                     "context_length_exceeded")
    return Fault(400, message_of(cause, w), "dimensions" if "dimensions" in cause.message else "input")


def _make_failed(exc: MakeFailed, w: Wording) -> Fault:
    if isinstance(exc.cause, ModelNotFound):
        return Fault(404, exc.missing or message_of(exc.cause, w))
    return Fault(400, message_of(exc.cause, w))


# The one table: what each refusal is, in the order it is looked up (a kind before the kinds it is made of).
TABLE: tuple[tuple[type, Callable[..., Fault]], ...] = (
    (Refused, _refused),
    (TooLong, _too_long),
    (LoadFailed, _load_failed),
    (LoadRefused, _load_refused),
    (EmbedFailed, _embed_failed),
    (MakeFailed, _make_failed),
    (PromptFailed, lambda exc, w: Fault(400, f"cannot build the prompt: {exc}")),
    (QueueFull, lambda exc, w: Fault(429, exc.message, code="queue_full")),
    (ServerStopping, lambda exc, w: Fault(503, exc.failure or STOPPING)),  # a scheduler that failed says why
    (OptionError, _option),
    (BadImage, lambda exc, w: Fault(400, exc.message, exc.name, "invalid_image")),
    (NoProjector, _no_projector),
    (SettingError, _setting),  # a request's lora, a reranker's query, documents or top_n
    (UsageError, lambda exc, w: Fault(400, message_of(exc, w))),  # a chat template refusing these messages, a grammar
    (LocalrunError, lambda exc, w: Fault(500, message_of(exc, w))),
)


def is_refusal(exc: BaseException) -> bool:
    """Whether the table words `exc` (anything else is a fault of the server's own: a traceback and a 500)."""
    return any(isinstance(exc, kind) for kind, _ in TABLE)


def fault(exc: BaseException, wording: Wording) -> Fault:
    """`exc` as a status, a message, the field at fault and a code, the field named by `wording`."""
    for kind, make in TABLE:
        if isinstance(exc, kind):
            return make(exc, wording)
    raise TypeError(f"not a refusal: {type(exc).__name__}")


def failure_text(exc: BaseException) -> str:
    """What a stream says of an answer that failed on its way (its error event): a server stopping says so; the
    rest in their own words."""
    if isinstance(exc, ServerStopping):  # (the command line's words say how to start one again)
        return exc.failure or STOPPING
    if isinstance(exc, LocalrunError):
        return exc.message
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"{type(exc).__name__}: {exc}"
