"""localrun's own dialect, spoken by `localrun run` and `chat` to the resident server: a run request is the model,
its load and the request as the command line made them (runtime.resident reads it); what comes back is the engine's
responses as JSON Lines ({"notice": ...}, a response, or {"error": ..., "exit": N}), ended by {"end": true}.
Failures are worded as the command line words them (flags named as flags: runtime.failures), with its exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Optional

from ..errors import InvalidModelFile, LocalrunError, ModelNotFound, UsageError
from ..runtime.failures import message_for
from ..runtime.identity import build_identity
from ..runtime.options import LOAD_FIELDS, LoadSpec
from ..runtime.pool import LoadCancelled, ModelTooBig, PoolBusy, parse_keep_alive
from ..runtime.resident import wire  # noqa: F401 - a response as this dialect writes it
from .errors import ApiError


class Refused(ApiError):
    """A run request refused: its status, the message and the exit code the command line exits with."""

    def __init__(self, status: int, message: str, exit_code: int = 1, **extra: Any):
        super().__init__(status, message, code=extra.get("code"))
        self.exit_code, self.extra = exit_code, extra


def error_answer(exc: ApiError, model: Optional[str] = None) -> tuple[int, dict]:
    return exc.status, {"error": exc.message, "exit": getattr(exc, "exit_code", 1), **getattr(exc, "extra", {})}


def load_failure(exc: LocalrunError, ref: str) -> tuple[int, str, str]:
    """(HTTP status, message, code) for a model the pool could not give: the same table for every dialect."""
    if isinstance(exc, ModelNotFound):
        return 404, exc.message, "model_not_found"
    if isinstance(exc, ModelTooBig):
        return 400, exc.message, "model_too_big"
    if isinstance(exc, PoolBusy):
        return 503, exc.message, "models_busy"
    if isinstance(exc, LoadCancelled):  # nobody reads it: the access log's line
        return 499, exc.message, "cancelled"
    if isinstance(exc, UsageError):
        return 400, exc.message, "invalid_options"
    if isinstance(exc, InvalidModelFile):  # the file named is no model (its message names it): as /api/show says
        return 400, exc.message, "invalid_model_file"
    return 500, f"cannot load {ref}: {exc.message}", "load_failed"


def run_request(raw: bytes, *, parallel: int, stopping: bool, busy: Callable[[], bool]) -> tuple[str, dict, LoadSpec, Optional[float]]:
    """(the model, the request, its load, its keep-alive) of a run request; Refused for what cannot be run."""
    try:
        body = json.loads(raw)
        ref, payload = str(body["model"]), dict(body["request"])
        load = {k: v for k, v in (body.get("load") or {}).items() if k in LOAD_FIELDS}
    except (ValueError, TypeError, KeyError):
        raise Refused(400, "a run request needs model, request (and optionally load, keep_alive, identity)", 2) from None
    if body.get("identity") != build_identity():
        raise Refused(409, f"this server is {build_identity()}", 1, code="other_build", busy=busy())
    if stopping:
        raise Refused(503, "the server is shutting down: retry", 1, code="stopping")
    try:
        spec = LoadSpec(parallel=parallel, kind="run", **load)
        spec.check()
        keep_alive = None if body.get("keep_alive") is None else parse_keep_alive(body["keep_alive"])
    except (LocalrunError, TypeError) as exc:
        raise Refused(400, message_for(exc)[0] if isinstance(exc, LocalrunError) else str(exc), 2) from None
    return ref, payload, spec, keep_alive


def load_failed(exc: BaseException, ref: str) -> Refused:
    """A model the pool could not give, worded as the command line words it (flags), with its exit code."""
    message, exit_code = message_for(exc)
    if isinstance(exc, LocalrunError):
        status, _, code = load_failure(exc, ref)
        return Refused(status, message, exc.exit_code, code=code)
    return Refused(500, message, exit_code, code="load_failed")


def failure(exc: BaseException) -> dict:
    """The line a run that failed on the way ends with."""
    message, exit_code = message_for(exc)
    return {"error": message, "exit": exit_code}
