"""The one table from an exception to what a user reads: a sentence naming settings in their own names (an
errors.Phrase) and an exit code. Each edge words the settings: the command line as flags (cli.failures), the
server's own dialect for `localrun run` (serve.dialects.native) the same way, so a failure reads the same either
way; no sentence here names a flag (`flag` is how those edges name one)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import EXIT_INTERRUPTED, EXIT_RUNTIME, ContextOverflow, LocalrunError, Phrase


def flag(setting: str) -> str:
    """A setting as the command line names it, its flag (ctx -> --ctx, kv_type -> --kv-type): how cli.failures words
    an error's settings, and how the server's own dialects name a setting only its command line sets."""
    return "--" + setting.replace("_", "-")


def phrase_for(exc: BaseException) -> tuple[Phrase, int]:
    """Map an exception to (the sentence, exit code). Unknown errors keep their type name."""
    from ..store.sessions import SessionMismatch

    if isinstance(exc, SessionMismatch):
        return Phrase("{said}: resume it with {%s} {saved}" % exc.setting, said=exc.phrase, saved=exc.saved), exc.exit_code
    if isinstance(exc, ContextOverflow) and exc.n_train:  # (engine.Engine.check_fits) what the user can change
        return (Phrase("{said}: raise {ctx} (up to the model's {n_train}) or pass {truncate} to keep its end",
                       said=exc.phrase, n_train=exc.n_train), exc.exit_code)
    if isinstance(exc, LocalrunError):
        return exc.phrase, exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return Phrase("interrupted"), EXIT_INTERRUPTED
    if isinstance(exc, MemoryError):
        return Phrase("out of memory: try a smaller {ctx} or a smaller quant"), EXIT_RUNTIME
    if isinstance(exc, OSError) and exc.errno == 30:  # EROFS: the store's own writes say so already; the server's files too
        from ..store.files import StoreReadOnly

        error = StoreReadOnly(exc.filename or "LOCALRUN_HOME")
        return error.phrase, error.exit_code
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return (Phrase("no space left on device ({where}): free some space or set LOCALRUN_HOME/HF_HOME elsewhere",
                       where=exc.filename or "disk"), EXIT_RUNTIME)
    if type(exc).__module__ == "sqlite3" and type(exc).__name__ in ("DatabaseError", "IntegrityError", "DataError"):
        from ..store.sessions import damaged_index  # only the session index is SQLite

        error = damaged_index(exc)
        return error.phrase, error.exit_code
    if isinstance(exc, PermissionError):
        return Phrase("permission denied: {path}: check the path's ownership or set LOCALRUN_HOME", path=exc.filename), EXIT_RUNTIME
    return Phrase("{kind}: {exc} (set LOCALRUN_DEBUG=1 for a traceback)", kind=type(exc).__name__, exc=exc), EXIT_RUNTIME


def message_for(exc: BaseException, name_of: Callable[[str], str]) -> tuple[str, int]:
    """(one-line message, exit code) of an exception, each setting it names named by `name_of`."""
    phrase, exit_code = phrase_for(exc)
    return phrase.worded(name_of), exit_code
