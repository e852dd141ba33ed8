"""The command line's words for a failure: the settings an error names (errors.Phrase) as the flags that set them,
one line and an exit code (runtime.failures has the table)."""

from __future__ import annotations

from ..runtime import failures
from ..runtime.failures import flag


def message_for(exc: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) as the command line prints it."""
    return failures.message_for(exc, flag)
