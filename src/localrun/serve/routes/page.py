"""The chat page at `/`, as llama-server has one: a browser (a request that accepts text/html) gets the page, which
talks to this server's /v1 like any client; every other client gets Ollama's "Ollama is running", which its clients
probe. The page's files (serve/static: HTML, CSS and JavaScript, no build step) come from the package, under
/static/; nothing is fetched from elsewhere, and the page's Content-Security-Policy lets it reach this server only."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from ..dialects import shape_for
from ..endpoint import refused
from ..errors import Refused
from ..guards import PAGE_FILES
from . import ollama

STATIC = Path(__file__).resolve().parent.parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
# The page shows what a model writes (escaped, then its markdown drawn): whatever got through could still run no
# script of its own, load nothing from elsewhere, nor send anything anywhere but here.
SECURITY = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
}


def wants_page(accept: str) -> bool:
    """A browser asks for text/html by name; Ollama's clients and curl send no Accept, */* or JSON."""
    return any(part.split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml") for part in accept.split(","))


async def root(request: Request):
    if request.method == "GET" and wants_page(request.headers.get("accept", "")):
        return _file("index.html")
    return await ollama.root(request)


async def asset(request: Request):
    name = request.path_params["name"]
    if name == "index.html" or name not in _names():
        missing = Refused(f"no such file of the chat page: {request.url.path}", status=404, code="not_found")
        return refused(missing, shape_for(request.url.path, request.headers))
    return _file(name)


def _names() -> set[str]:
    return {p.name for p in STATIC.iterdir() if p.suffix in TYPES}


def _file(name: str) -> HttpResponse:
    path = STATIC / name
    return HttpResponse(path.read_bytes(), media_type=TYPES[path.suffix], headers=SECURITY)


ROUTES = [Route("/", root, methods=["GET", "HEAD"]), Route(PAGE_FILES + "{name}", asset, methods=["GET", "HEAD"])]
