"""The errors localrun reports as one line and an exit code (see console.render_error).

An error names the settings it is about (ctx, batch, mmproj, keep_alive: the load and sampling options' names), never
a command-line flag or a request field: the edge words them (`worded(name_of)`), the command line as flags
(cli.failures), each HTTP dialect as its request's fields (serve.errors)."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterable

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Phrase:
    """A sentence that names settings: `template` is fixed text where `{name}` is one of `values` (a number, a path:
    put in as it is) or else a setting, named by the edge. `Phrase("try a smaller {ctx} or {batch}")` reads "try a
    smaller --ctx or --batch" on the command line and "try a smaller options.num_ctx or options.num_batch" to an
    Ollama client."""

    def __init__(self, template: str, **values: object):
        self.template, self.values = template, values

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings it names, in order (those of a Phrase among its values too)."""
        names = []
        for _, field, _, _ in string.Formatter().parse(self.template):
            if field and field not in self.values:
                names.append(field)
            elif field and isinstance(self.values[field], Phrase):
                names += self.values[field].settings
        return tuple(dict.fromkeys(names))

    def worded(self, name_of: Callable[[str], str]) -> str:
        """The sentence with each setting named by `name_of` (a Phrase among the values: worded the same way)."""
        values = {k: v.worded(name_of) if isinstance(v, Phrase) else v for k, v in self.values.items()}
        names = {field: name_of(field) for _, field, _, _ in string.Formatter().parse(self.template)
                 if field and field not in values}
        return self.template.format_map({**names, **values})

    def __str__(self) -> str:
        return self.worded(str)


def _as_phrase(message: "str | Phrase") -> Phrase:
    return message if isinstance(message, Phrase) else Phrase("{text}", text=message)


class LocalrunError(Exception):
    """A failure the user can act on: `message` says what went wrong and how to fix it, with the settings it names
    in their own names; `worded(name_of)` names them as an edge does (a flag, a request field)."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: "str | Phrase"):
        self.phrase = _as_phrase(message)
        self.message = self.phrase.worded(str)
        super().__init__(self.message)

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings the message names (what a user may change)."""
        return self.phrase.settings

    def worded(self, name_of: Callable[[str], str]) -> str:
        """The message with each setting it names named by `name_of(setting)` (a flag, a request field)."""
        return self.phrase.worded(name_of)


class UsageError(LocalrunError):
    """Bad arguments or options."""

    exit_code = EXIT_USAGE


class SettingError(UsageError):
    """A setting given a value it cannot take. `setting` names it as the load and sampling options do
    ("ctx", "kv_type", "threads", "logit_bias", ...; None: a rule across settings), `value` is what was
    given, `reason` why it is refused (a Phrase where it names other settings). Worded at the edge: a flag on the
    command line (cli.failures), a field in each HTTP dialect (serve.errors)."""

    def __init__(self, setting: "str | None", value: object, reason: "str | Phrase"):
        self.setting, self.value = setting, value
        reason = _as_phrase(reason)
        self.reason = reason.worded(str)
        if setting is None:
            super().__init__(reason)
        else:  # the setting is a placeholder of the sentence, named by the edge as the settings of its reason are
            super().__init__(Phrase("invalid {%s} {shown}: {reason}" % setting, shown=_shown(value), reason=reason))


def _shown(value: object) -> str:
    """A value as an error shows it: a list or an object as JSON (as an HTTP client sent it: [{"id": 5}], not a
    Python repr), anything else as its repr ('q8_0', 2)."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=repr)
    return repr(value)


class SettingsConflict(UsageError):
    """Settings that cannot be given together (`conflicting`, in their own names): `remedy` says what to do instead
    (a Phrase where it names settings). "--beams and --draft do not combine: pick one" on the command line."""

    def __init__(self, settings: Iterable[str], remedy: "str | Phrase" = "pick one"):
        self.conflicting = tuple(settings)
        self.remedy = _as_phrase(remedy)
        names = ["{%s}" % s for s in self.conflicting]
        names = ", ".join(names[:-1]) + " and " + names[-1]
        super().__init__(Phrase(names + " do not combine: {remedy}", remedy=self.remedy))


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
