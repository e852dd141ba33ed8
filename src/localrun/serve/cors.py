"""Browsers: which web pages may call this server, as Ollama lets them. A request a browser sends from another
origin (a page elsewhere, an extension, an editor's webview) carries an Origin header: one this server allows gets
the CORS headers that let the page read the answer; one it does not is refused (403) before any route sees it, so
that a page cannot make the model work (or delete one) with a request the browser sends without asking first.

Allowed by default, as Ollama allows them: loopback pages (http and https on localhost, 127.0.0.1, [::1] and
0.0.0.0, any port) and desktop shells (app://, file://, tauri://, vscode-webview://, vscode-file://). More are added
by LOCALRUN_ORIGINS or the command line: exact origins, patterns with one * (http://192.168.1.*,
chrome-extension://*), or * alone for every origin. A request from the server's own page (its Origin is the Host it
asked) is no cross-origin request and passes.

A preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin is answered here on every path,
without the API key: the browser sends it without the key, then the request itself with it.

A server listening on loopback only answers requests addressed to a local name (Host: localhost or another name of
one label, a loopback or private address, this machine's name, *.localhost, *.local, *.internal), as Ollama does: a page on another site
whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused, key or not."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable

from .dialects import error_bytes
from .errors import Fault

_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")
DEFAULT_ORIGINS = (
    *(f"{scheme}://{host}{port}" for host in _LOOPBACK_HOSTS for scheme in ("http", "https") for port in ("", ":*")),
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
)
# What a browser may send with a request from an allowed page, besides what it asks for in its preflight: the key
# (both dialects' headers), the body's type, the headers the OpenAI and Anthropic SDKs add.
ALLOWED_HEADERS = ("Authorization", "Content-Type", "x-api-key", "anthropic-version", "anthropic-beta",
                   "anthropic-dangerous-direct-browser-access", "OpenAI-Beta", "Accept", "User-Agent", "X-Requested-With")
ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
MAX_AGE_S = 43200  # how long a browser may keep a preflight's answer (Ollama's: 12 hours)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # a header name (RFC 9110's token)
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def env_origins() -> list[str]:
    """LOCALRUN_ORIGINS: origins to allow besides the defaults, comma-separated."""
    return split_origins(os.environ.get("LOCALRUN_ORIGINS", ""))


def split_origins(given: str) -> list[str]:
    return [o.strip().strip("\"'").rstrip("/") for o in given.split(",") if o.strip().strip("\"'")]


def bad_origin(pattern: str) -> str | None:
    """What is wrong with an origin pattern (None: nothing): a scheme and a host, at most one *, no path."""
    if pattern == "*":
        return None
    if pattern.count("*") > 1:
        return "use at most one * in an origin"
    scheme, sep, rest = pattern.partition("://")
    if not sep or not scheme or not rest and scheme != "file":
        return "an origin is SCHEME://HOST[:PORT], e.g. http://192.168.1.20:8080"
    if "/" in rest:
        return "an origin has no path: SCHEME://HOST[:PORT]"
    return None


class Origins:
    """The origins a server allows: the defaults and those given (each an origin, a pattern with one *, or *)."""

    def __init__(self, given: Iterable[str] = ()):
        self.given = [g for g in given if g]
        self.every = "*" in self.given
        patterns = [*DEFAULT_ORIGINS, *(g for g in self.given if g != "*")]
        self._exact = {p.lower() for p in patterns if "*" not in p}
        self._wild = [re.compile("^" + re.escape(p.lower()).replace(r"\*", "[^/]*") + "$") for p in patterns if "*" in p]

    def allows(self, origin: str) -> bool:
        origin = origin.lower()
        return self.every or origin in self._exact or any(w.match(origin) for w in self._wild)


def browsers(app, origins: Origins):
    """ASGI wrapper, outside the key and the body cap (so that their refusals carry the CORS headers a page needs to
    read them): a preflight from an allowed origin answered here; another request from one given the CORS headers;
    one from an origin not allowed, or to a loopback server under a name that is not local, refused (403)."""

    async def checked(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = dict(scope["headers"])
        if not _local_enough(scope, headers):
            host = headers.get(b"host", b"").decode("latin-1")
            return await _forbidden(scope, headers, send, f"this server listens on loopback and does not answer requests for "
                                                          f"the host {host!r}: address it as localhost or 127.0.0.1")
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not origin or _same_origin(origin, headers):
            return await app(scope, receive, send)
        if not origins.allows(origin):
            return await _forbidden(scope, headers, send, f"requests from the origin {origin} are not allowed here: add it to "
                                                          "the server's allowed origins (or LOCALRUN_ORIGINS)")
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            return await _preflight(origin, headers, send)

        async def with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_cors_headers(origin)]}
            await send(message)

        await app(scope, receive, with_cors)

    return checked


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _preflight(origin: str, headers: dict, send) -> None:
    asked = [h.strip() for h in headers.get(b"access-control-request-headers", b"").decode("latin-1").split(",")]
    allowed = list(ALLOWED_HEADERS)
    known = {h.lower() for h in allowed}
    allowed += [h for h in asked if h and _TOKEN.match(h) and h.lower() not in known]  # the SDKs' x-stainless-* and more
    await send({"type": "http.response.start", "status": 204, "headers": [
        *_cors_headers(origin), (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
        (b"access-control-allow-headers", ", ".join(allowed).encode("latin-1")),
        (b"access-control-max-age", str(MAX_AGE_S).encode())]})
    await send({"type": "http.response.body", "body": b""})


async def _forbidden(scope, headers: dict, send, message: str) -> None:
    body = error_bytes(scope["path"], headers, Fault(403, message, code="forbidden"))
    await send({"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _same_origin(origin: str, headers: dict) -> bool:
    """The server's own page (the chat page): its Origin is the address the request was sent to."""
    host = headers.get(b"host", b"").decode("latin-1").lower()
    return bool(host) and origin.lower() in (f"http://{host}", f"https://{host}")


def _local_enough(scope, headers: dict) -> bool:
    """A server bound to a loopback address answers only requests addressed to a local name (DNS rebinding); one
    bound to another address (the LAN, every address) answers any, as its operator chose to expose it."""
    server = scope.get("server")
    if not server or server[1] is None or not _is_loopback(server[0]):
        return True  # (the resident server's Unix socket: no host)
    return local_host(_hostname(headers.get(b"host", b"").decode("latin-1")))


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def local_host(host: str) -> bool:
    """Whether a Host header's name is local (Ollama's allowedHost): none, a loopback, private or unspecified address,
    a name of one label (localhost, this machine's name, a name from /etc/hosts: no site on the internet has one), or a
    name under .localhost, .local or .internal."""
    host = host.lower().rstrip(".")
    if "." not in host.strip("[]") or host.endswith(_LOCAL_SUFFIXES) or host == socket.gethostname().lower():
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_unspecified or address.is_link_local
