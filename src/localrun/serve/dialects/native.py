"""localrun's own dialect, spoken by `localrun run` and `chat` to the resident server: a run request is the model,
its load and the request as the command line made them (runtime.serving.resident reads it); what comes back is the engine's
responses as JSON Lines ({"notice": ...}, a response, or {"error": ..., "exit": N}), ended by {"end": true}.
Failures are worded as the command line words them (runtime.failures' table, each setting named as its flag), with its
exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Optional

from ...errors import LocalrunError
from ...runtime.failures import flag, message_for
from ...runtime.client.identity import build_identity
from ...runtime.options import LOAD_FIELDS, LoadSpec, parse_keep_alive
from ...runtime.serving.resident import wire
from ..errors import LOAD_SETTINGS, LoadFailed, Refused, Wording, fault


class RunRefused(Refused):
    """A run request refused: its status, the message and the exit code the command line exits with."""

    def __init__(self, status: int, message: str, exit_code: int = 1, **extra: Any):
        super().__init__(message, status=status, code=extra.get("code"))
        self.exit_code, self.extra = exit_code, extra


# The command line is this dialect's client: what it can change is its own flags
WORDING = Wording(more_context="raise --ctx", no_projector="pass --mmproj FILE", load_options=LOAD_SETTINGS)


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    if isinstance(exc, RunRefused):
        return exc.status, {"error": exc.reason, "exit": exc.exit_code, **exc.extra}
    f = fault(exc, WORDING)
    return f.status, {"error": f.message, "exit": 1, **({"code": f.code} if f.code else {})}


def run_request(raw: bytes, *, parallel: int, stopping: bool, busy: Callable[[], bool]) -> tuple[str, dict, LoadSpec, Optional[float]]:
    """(the model, the request, its load, its keep-alive) of a run request; Refused for what cannot be run."""
    try:
        body = json.loads(raw)
        ref, payload = str(body["model"]), dict(body["request"])
        load = {k: v for k, v in (body.get("load") or {}).items() if k in LOAD_FIELDS}
    except (ValueError, TypeError, KeyError):
        raise RunRefused(400, "a run request needs model, request (and optionally load, keep_alive, identity)", 2) from None
    if body.get("identity") != build_identity():
        raise RunRefused(409, f"this server is {build_identity()}", 1, code="other_build", busy=busy())
    if stopping:
        raise RunRefused(503, "the server is shutting down: retry", 1, code="stopping")
    try:
        spec = LoadSpec(parallel=parallel, kind="run", **load)
        spec.check()
        keep_alive = None if body.get("keep_alive") is None else parse_keep_alive(body["keep_alive"])
    except (LocalrunError, TypeError) as exc:
        raise RunRefused(400, message_for(exc, flag)[0] if isinstance(exc, LocalrunError) else str(exc), 2) from None
    return ref, payload, spec, keep_alive


def line_of(response) -> dict:
    """A response of the request path (engine.Response) as this dialect writes it (runtime.serving.resident.wire)."""
    return wire(response)


def load_failed(exc: BaseException, ref: str) -> RunRefused:
    """A model the pool could not give, worded as the command line words it (flags), with its exit code; its status
    and code as every dialect's (serve.errors)."""
    message, exit_code = message_for(exc, flag)
    if isinstance(exc, LocalrunError):
        f = fault(LoadFailed(exc, ref), WORDING)
        return RunRefused(f.status, message, exc.exit_code, code=f.code)
    return RunRefused(500, message, exit_code, code="load_failed")


def failure(exc: BaseException) -> dict:
    """The line a run that failed on the way ends with."""
    message, exit_code = message_for(exc, flag)
    return {"error": message, "exit": exit_code}
