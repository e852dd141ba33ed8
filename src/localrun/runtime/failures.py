"""The one table from an exception to what a user reads: a one-line message and an exit code. The CLI
prints it; the background server sends it to the `run` that asked, so a failure reads the same either way."""

from __future__ import annotations

from ..errors import EXIT_INTERRUPTED, EXIT_RUNTIME, ContextOverflow, LocalrunError, SettingError


def flag(setting: str) -> str:
    """The command line's flag for a load or sampling setting."""
    return "--" + setting.replace("_", "-")


def message_for(exc: BaseException) -> tuple[str, int]:
    """Map an exception to (one-line message, exit code). Unknown errors keep their type name."""
    if isinstance(exc, SettingError):
        return exc.worded(flag), exc.exit_code
    from ..store.sessions import SessionMismatch

    if isinstance(exc, SessionMismatch):
        return f"{exc.message}: resume it with {flag(exc.setting)} {exc.saved}", exc.exit_code
    if isinstance(exc, ContextOverflow) and exc.n_train:  # (engine.Engine.check_fits) what the command line can change
        return (f"{exc.message}: raise --ctx (up to the model's {exc.n_train}) or pass --truncate to keep its end",
                exc.exit_code)
    if isinstance(exc, LocalrunError):
        return exc.message, exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, MemoryError):
        return "out of memory: try a smaller --ctx or a smaller quant", EXIT_RUNTIME
    if isinstance(exc, OSError) and exc.errno == 30:  # EROFS: the store's own writes say so already; the server's files too
        from ..store.files import StoreReadOnly

        error = StoreReadOnly(exc.filename or "LOCALRUN_HOME")
        return error.message, error.exit_code
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return f"no space left on device ({exc.filename or 'disk'}): free some space or set LOCALRUN_HOME/HF_HOME elsewhere", EXIT_RUNTIME
    if type(exc).__module__ == "sqlite3" and type(exc).__name__ in ("DatabaseError", "IntegrityError", "DataError"):
        from ..store.sessions import damaged_index  # only the session index is SQLite

        error = damaged_index(exc)
        return error.message, error.exit_code
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}: check the path's ownership or set LOCALRUN_HOME", EXIT_RUNTIME
    return f"{type(exc).__name__}: {exc} (set LOCALRUN_DEBUG=1 for a traceback)", EXIT_RUNTIME
