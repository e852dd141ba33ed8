"""What the HTTP layer refuses before any route sees a request, for every route alike: a page on an origin the
server does not allow (403, serve.cors), a request without one of the API keys (401), a body over the cap (413,
answered at once from Content-Length, or as soon as a chunked body passes it), and a connection that has not sent
its request's headers in time (a slow-loris client: closed). Each refusal is in the shape of the dialect its path
belongs to. JSON bodies that are not JSON (NaN, a lone surrogate) are refused where they are parsed
(serve.wire.parse_json)."""

from __future__ import annotations

import hmac
import os
from typing import Optional

from .cors import Origins, browsers
from .dialects import error_bytes, speaks_anthropic
from .errors import Fault

DEFAULT_MAX_BODY = 32 << 20  # 32 MiB: a long conversation with a few images in base64 fits; LOCALRUN_MAX_BODY (MiB) changes it
UPLOADS = "/api/blobs/"  # files for /api/create (a LoRA adapter: often over the cap), streamed to disk and checked by digest
PAGE_FILES = "/static/"  # the chat page's files (serve.page), public as the page is
HEADER_TIMEOUT_S = 10.0  # a request's headers must be whole this long after the connection (or the last answer)


def header_timeout_s() -> float:
    """LOCALRUN_HEADER_TIMEOUT (seconds), else the default."""
    try:
        return float(os.environ.get("LOCALRUN_HEADER_TIMEOUT") or HEADER_TIMEOUT_S)
    except ValueError:
        return HEADER_TIMEOUT_S


def max_body_bytes() -> int:
    """The body cap: LOCALRUN_MAX_BODY in MiB (0: none), else the default."""
    given = os.environ.get("LOCALRUN_MAX_BODY")
    if not given:
        return DEFAULT_MAX_BODY
    try:
        mib = float(given)
    except ValueError:
        return DEFAULT_MAX_BODY
    return int(mib * (1 << 20)) if mib > 0 else 0


def limit_body(app, max_bytes: int):
    """ASGI wrapper: a body over `max_bytes` is a 413 in the dialect's shape, read no further. An upload (UPLOADS)
    is not held in memory but streamed to a file by its route: it has no cap."""
    if max_bytes <= 0:
        return app

    async def limited(scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(UPLOADS):
            return await app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        first = None if length is not None and length.isdigit() and int(length) > max_bytes else await _read_capped(receive, max_bytes)
        if first is None:
            return await _too_large(scope, send, max_bytes)
        given = False

        async def replayed():
            nonlocal given
            if not given:
                given = True
                return first
            return await receive()

        await app(scope, replayed, send)

    return limited


async def _read_capped(receive, max_bytes: int) -> Optional[dict]:
    """The body read here (routes read it whole anyway), counting: the one ASGI message that gives it whole, or the
    client's going away while it sent it (the route sees that); None past the cap, where nothing more is read."""
    chunks, seen = [], 0
    while True:
        event = await receive()
        if event["type"] != "http.request":
            return event
        seen += len(event.get("body", b""))
        if seen > max_bytes:
            return None
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


async def _too_large(scope, send, max_bytes: int) -> None:
    message = f"the request body is over this server's limit of {max_bytes >> 20} MiB: send less, or raise LOCALRUN_MAX_BODY (MiB)"
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": error_bytes(scope["path"], dict(scope["headers"]), Fault(413, message))})


def header_timeout(protocol_class: type, seconds: Optional[float] = None) -> type:
    """uvicorn's HTTP protocol with a deadline for each request's headers: a connection that is still
    sending them (or sends nothing) after `seconds` is closed, so slow clients cannot hold connections."""
    return type("WithHeaderTimeout", (_HeaderDeadline, protocol_class),
                {"header_timeout_s": header_timeout_s() if seconds is None else seconds})


class _HeaderDeadline:
    """Mixed into uvicorn's HTTP protocol (header_timeout): the deadline, armed as a connection opens and after each
    answer, disarmed once a request's headers are in."""

    header_timeout_s = HEADER_TIMEOUT_S
    _deadline = None
    _started = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._started = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.cycle is self._started and not self.transport.is_closing():
            self.transport.close()  # no new request began: its headers never came

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._started:
            self._disarm()  # the headers are in: a request began

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


def given_key(headers: dict) -> bytes:
    """The API key a request carries: `Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 has
    it), or Anthropic's `x-api-key: KEY`."""
    scheme, _, token = headers.get(b"authorization", b"").strip().partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return headers.get(b"x-api-key", b"").strip()


def read_key_file(path) -> list[str]:
    """The keys in a key file: one a line; blank lines and lines starting with # left out. OSError and
    UnicodeDecodeError as reading the file raises them (the command line words them)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("#")]


def public(path: str) -> bool:
    """Paths answered without the key: /health (a load balancer's probe) and the chat page with its files (no data:
    the page asks for the key itself, and sends it with each request)."""
    return path in ("/health", "/") or path.startswith(PAGE_FILES)


def require_key(app, keys):
    """ASGI wrapper: every path but the public ones needs one of `keys` (a key, or several: each a client's), as
    `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY` (compared with each in constant time); a 401 in
    the shape of the dialect the path is under."""
    expected = [k.encode() for k in ([keys] if isinstance(keys, str) else keys)]

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and not public(scope["path"]):
            headers = dict(scope["headers"])
            given = given_key(headers)
            if not sum(hmac.compare_digest(given, key) for key in expected):  # each compared: no early way out
                path = scope["path"]
                claude = speaks_anthropic(path, headers)
                how = "'x-api-key: KEY'" if claude else "'Authorization: Bearer KEY'"
                body = error_bytes(path, headers, Fault(401, f"missing or wrong API key: send {how}", code="invalid_api_key"))
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def guarded(app, options):
    """What every request of a server passes before its route, outermost first: the browser's checks (serve.cors:
    its origin, a preflight answered), the API key where `options` (ServeOptions) has any, the body cap."""
    app = limit_body(app, options.max_body)
    app = require_key(app, options.api_keys) if options.api_keys else app
    return browsers(app, Origins(options.origins))
