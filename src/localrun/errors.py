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


class ConfigError(LocalrunError):
    """models.yaml (or a user override) is malformed."""


class ModelNotFound(LocalrunError):
    """An alias or repository that does not resolve, or a model that is not pulled."""


class QuantNotFound(ModelNotFound):
    """The repository has no file for the asked quant."""


class DownloadError(LocalrunError):
    """A transfer failed or produced a file that does not verify."""


class IntegrityError(DownloadError):
    """A file's sha256 does not match what its source published."""


class InvalidModelFile(LocalrunError):
    """A file that is not a usable GGUF model (checked before llama.cpp sees it)."""


class ContextOverflow(LocalrunError):
    """A prompt that does not fit the context window: `n_prompt` tokens where `n_ctx` fit (where known)."""

    def __init__(self, message: str, n_prompt: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class EngineError(LocalrunError):
    """llama.cpp refused to load or decode."""


class SessionError(LocalrunError):
    """A saved session that cannot be used (wrong model, corrupt state, locked)."""
