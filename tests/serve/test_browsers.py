"""Browsers and `localrun serve` (CORS as Ollama does it): a page on an origin the server allows calls
/v1/chat/completions from headless Chromium (its preflight answered, the key sent with the request itself); a page
on another origin is refused by the browser's own preflight; loopback origins allowed by default, others by
--allowed-origins or LOCALRUN_ORIGINS (patterns, `*`); preflight answered on every route without the key; refusals
in the shape of the route's dialect."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading

import httpx
import pytest

from browser import chromium
from conftest import start_server

pytestmark = pytest.mark.slow
KEY = "browser-key-1"
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Every name under .example is this machine to the browser, so that a page can come from an origin that is not
# loopback by name (the server's default allows loopback pages) while its server is a local http.server.
HOST_RULES = "--host-resolver-rules=MAP *.example 127.0.0.1"


@contextlib.contextmanager
def static_pages(folder):
    """A plain http.server on a free loopback port serving `folder`: the other origin's pages."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *_: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALRUN_ORIGINS", "chrome-extension://*")
        srv = start_server(smollm2, tmp_path_factory.mktemp("home"), "--ctx", "512", "--parallel", "2", "--api-key", KEY,
                           "--allowed-origins", "http://allowed.example:*")
    with srv:
        yield srv


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    (folder / "index.html").write_text("<!doctype html><title>a page elsewhere</title><p>a page on another origin</p>")
    with static_pages(folder) as port:
        yield port


# What a page's script does: a streamed chat completion with the key, read to its end, or the error fetch throws.
FETCH = """async ({url, key}) => {
  try {
    const r = await fetch(url + "/v1/chat/completions", {method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + key},
      body: JSON.stringify({model: "%s", messages: [{role: "user", content: "Say hi."}], max_tokens: 4,
                            temperature: 0, stream: true})});
    return {status: r.status, text: await r.text()};
  } catch (e) {
    return {error: String(e)};
  }
}""" % SMOL


def test_a_page_on_an_allowed_origin_calls_the_api_and_another_is_refused(server, pages):
    with chromium(HOST_RULES) as browser:
        page = browser.new_page()
        page.goto(f"http://allowed.example:{pages}/")
        allowed = page.evaluate(FETCH, {"url": server.url, "key": KEY})
        assert allowed.get("status") == 200, allowed
        assert '"chat.completion.chunk"' in allowed["text"] and "data: [DONE]" in allowed["text"]
        wrong_key = page.evaluate(FETCH, {"url": server.url, "key": "not-the-key"})
        assert wrong_key.get("status") == 401, wrong_key  # the page can read the refusal (it carries the CORS headers)

        page.goto(f"http://elsewhere.example:{pages}/")
        refused = page.evaluate(FETCH, {"url": server.url, "key": KEY})
        assert "status" not in refused and "Failed to fetch" in refused["error"], refused
    # The refused page's preflight never reached a route: the one answer asked was the allowed page's
    counts = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'localrun_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in counts, counts


def preflight(server, path: str, origin: str, **extra):
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os", **extra}
    return httpx.options(server.url + path, headers=headers)


ROUTES = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/embeddings", "/v1/models", "/api/chat",
          "/api/tags", "/completion", "/tokenize", "/metrics", "/no/such/route"]


def test_preflight_on_every_route_without_the_key(server):
    for origin in ("http://localhost:5173", "http://127.0.0.1:8080", "https://[::1]", "file://", "app://obsidian.md",
                   "chrome-extension://abcdefghijklmnop", "http://allowed.example:1234"):
        for path in ROUTES:
            r = preflight(server, path, origin)
            assert r.status_code == 204, (origin, path, r.text)
            assert r.headers["access-control-allow-origin"] == origin
            assert "POST" in r.headers["access-control-allow-methods"]
            asked = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
            assert {"authorization", "content-type", "x-api-key", "x-stainless-os"} <= asked
            assert "Origin" in r.headers["vary"]


def test_another_origin_is_refused_in_the_routes_dialect(server):
    for path in ROUTES[:1] + ["/api/chat", "/v1/messages"]:
        for method in ("OPTIONS", "POST"):
            r = httpx.request(method, server.url + path, json={}, headers={
                "Origin": "http://elsewhere.example:8080", "Access-Control-Request-Method": "POST",
                "Authorization": f"Bearer {KEY}", "x-api-key": KEY})
            assert r.status_code == 403, (path, method, r.text)
            assert "access-control-allow-origin" not in r.headers
            body = r.json()
            if path == "/api/chat":  # Ollama's shape
                assert list(body) == ["error"] and "elsewhere.example" in body["error"]
            elif path == "/v1/messages":  # Anthropic's
                assert body["type"] == "error" and body["error"]["type"] == "permission_error"
            else:  # OpenAI's
                assert body["error"]["code"] == "forbidden" and "LOCALRUN_ORIGINS" in body["error"]["message"]
    # Close relatives of allowed origins are not allowed: another scheme, a longer name, another loopback address
    for origin in ("https://allowed.example:1", "http://allowed.example.evil.test:1", "http://127.0.0.2:80",
                   "moz-extension://abcdefghijklmnop", "null"):
        assert preflight(server, "/v1/chat/completions", origin).status_code == 403, origin


def test_requests_from_an_allowed_origin_still_need_the_key(server):
    origin = "http://localhost:3000"
    r = httpx.get(server.url + "/v1/models", headers={"Origin": origin})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin  # readable by the page
    r = httpx.get(server.url + "/v1/models", headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert [m["id"] for m in r.json()["data"]] == [SMOL]
    # A request with no Origin (curl, the SDKs) is no browser's, and is answered as before, without CORS headers
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_a_loopback_server_answers_local_names_only(server):
    """DNS rebinding: a site whose name was made to resolve to 127.0.0.1 reaches the server with its own Host."""
    port = server.port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"myhost.local:{port}", f"[::1]:{port}"):
        assert httpx.get(server.url + "/health", headers={"Host": host}).status_code == 200, host
    r = httpx.get(server.url + "/v1/models", headers={"Host": f"rebound.example.com:{port}", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 403 and "address it as localhost" in r.json()["error"]["message"]


def test_every_origin_with_a_star(tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("LOCALRUN_ORIGINS", raising=False)
        srv = start_server(None, tmp_path / "home", "--allowed-origins", "*")
    with srv:
        for origin in ("https://any.example", "http://192.168.1.20:8080", "moz-extension://x"):
            r = preflight(srv, "/api/tags", origin)
            assert r.status_code == 204 and r.headers["access-control-allow-origin"] == origin
            assert httpx.get(srv.url + "/api/tags", headers={"Origin": origin}).headers["access-control-allow-origin"] == origin
