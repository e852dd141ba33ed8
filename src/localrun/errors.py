"""The errors localrun reports as one line and an exit code (see console.render_error)."""

from __future__ import annotations

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class LocalrunError(Exception):
    """A failure the user can act on: `message` says what went wrong and how to fix it."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UsageError(LocalrunError):
    """Bad arguments or options."""

    exit_code = EXIT_USAGE


class SettingError(UsageError):
    """A setting given a value it cannot take. `setting` names it as the load and sampling options do
    ("ctx", "kv_type", "threads", "logit_bias", ...; None: a rule across settings), `value` is what was
    given, `reason` why it is refused. Worded at the edge (`worded`): a flag on the command line
    (runtime.failures), a field in each HTTP dialect."""

    def __init__(self, setting: "str | None", value: object, reason: str):
        self.setting, self.value, self.reason = setting, value, reason
        super().__init__(self.worded(lambda s: s))

    def worded(self, name_of) -> str:
        """The message with the setting named by `name_of(setting)` (a flag, a request field)."""
        if self.setting is None:
            return self.reason
        return f"invalid {name_of(self.setting)} {self.value!r}: {self.reason}"


class ConfigError(LocalrunError):
    """models.yaml (or a user override) is malformed."""


class ModelNotFound(LocalrunError):
    """An alias or repository that does not resolve, or a model that is not pulled."""


class UnknownModel(ModelNotFound):
    """A name that is no catalogue alias, no model made here and no repository. `close`: the aliases it may
    have meant. Worded for the command line; each front end may word its own remedy from `name` and `close`
    (the server points at its model list, not at a command)."""

    def __init__(self, name: str, close: list[str]):
        self.name, self.close = name, close
        super().__init__(f"unknown model '{name}': {self.guess}run `localrun list --available` to see aliases, "
                         "or use owner/repo[:QUANT]")

    @property
    def guess(self) -> str:
        """'did you mean A or B? ' (with its trailing space), or '' when nothing is close."""
        if not self.close:
            return ""
        return f"did you mean {', '.join(self.close[:-1]) + ' or ' + self.close[-1] if len(self.close) > 1 else self.close[0]}? "


class QuantNotFound(ModelNotFound):
    """The repository has no file for the asked quant."""


class DownloadError(LocalrunError):
    """A transfer failed or produced a file that does not verify."""


class IntegrityError(DownloadError):
    """A file's sha256 does not match what its source published."""


class InvalidModelFile(LocalrunError):
    """A file that is not a usable GGUF model (checked before llama.cpp sees it)."""


class ContextOverflow(LocalrunError):
    """A prompt that does not fit the context window: `n_prompt` tokens where `n_ctx` fit (where known);
    `n_train`: the context the model was trained for (where known: how far the context may be raised)."""

    def __init__(self, message: str, n_prompt: int = 0, n_ctx: int = 0, n_train: int = 0):
        super().__init__(message)
        self.n_prompt, self.n_ctx, self.n_train = n_prompt, n_ctx, n_train


class EngineError(LocalrunError):
    """llama.cpp refused to load or decode."""


class SessionError(LocalrunError):
    """A saved session that cannot be used (wrong model, corrupt state, locked)."""


class TemplateError(UsageError):
    """A chat template that refuses the messages (its own raise_exception) or fails on them, or one that is not
    valid Jinja. `reason`: the template's own message (or Jinja's, for a template that fails or does not
    compile); `line`: the template's line where known; `compiling`: the template itself is broken (not these
    messages). A bad request at the HTTP edge (400), never a server error."""

    def __init__(self, reason: str, line: "int | None" = None, compiling: bool = False):
        self.reason, self.line, self.compiling = reason, line, compiling
        where = f"line {line}: " if line else ""
        if compiling:
            message = f"the chat template is not valid Jinja ({where}{reason})"
        else:
            message = f"the model's chat template refuses these messages: {where}{reason}"
        super().__init__(message)
