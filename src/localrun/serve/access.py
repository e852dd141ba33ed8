"""The access log: one line per HTTP request on the server's stderr, as Ollama's log has one (and uvicorn's,
which `serve` turns off): when it ended, its status, how long it took, the method and path, the model it
named, the prompt's tokens (and how many of them came from a cache), the tokens generated and the time to the
first. A handler says which model and the answer's figures through `note`; a streamed answer's line is
written when its stream ends (or its client goes away). `serve --quiet` leaves it out."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from typing import Any, Optional

_KEY = "localrun.access"


def note(request: Any, *, model: Optional[str] = None, stats: Any = None, status: Optional[int] = None) -> None:
    """Record for the request's line which model answered it and its answer's figures (runtime.Stats: prompt,
    cached and generated tokens, time to the first); `status`: how a stream ended when that is not the status
    its head carried (499: the client went away)."""
    entry = request.scope.get(_KEY)
    if entry is None:
        return
    if status is not None:
        entry["status"] = status
    if model is not None:
        entry["model"] = model
    if stats is not None:
        prompt, cached, generated = entry.get("tokens", (0, 0, 0))  # n choices: each job adds its own
        entry["tokens"] = (prompt + stats.prompt_tokens, cached + stats.cached_tokens, generated + stats.generated_tokens)
        entry.setdefault("ttft", stats.ttft_s)


def line(method: str, path: str, status: int, seconds: float, model: Optional[str], tokens: Optional[tuple[int, int, int]],
         ttft: Optional[float] = None) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    used = "-"
    if tokens:
        used = f"{tokens[0]} in ({tokens[1]} cached), {tokens[2]} out" + (f", ttft {ttft:.3f}s" if ttft is not None else "")
    return f"[access] {when} | {status} | {seconds:8.3f}s | {method} {path} | {model or '-'} | {used}"


def access_log(app, out=None):
    """ASGI wrapper around the whole app (so a 401 or a 413 is logged too)."""

    async def logged(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        entry: dict[str, Any] = {}
        scope[_KEY] = entry
        status = [0]
        written = [False]

        def write() -> None:
            if written[0]:
                return
            written[0] = True
            print(line(scope["method"], scope["path"], entry.get("status") or status[0] or 499, time.perf_counter() - started, entry.get("model"),
                       entry.get("tokens"), entry.get("ttft")), file=out or sys.stderr, flush=True)

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                write()

        try:
            await app(scope, receive, sending)
        finally:
            write()  # the client went away before the answer was whole (499), or the handler failed

    return logged
