"""The HTTP layer under hostile or sloppy input, against a real `localrun serve` with SmolLM2: a body over
the cap is a 413 at once (from Content-Length, or as a chunked body passes it) while /health keeps
answering; a connection that never finishes its headers is closed; NaN, a lone surrogate, a message
without content and numbers or booleans written as strings are 400s in the dialect's shape; seed -1 is
random, as in llama.cpp and Ollama; the API key's scheme is case-insensitive, and Anthropic's x-api-key
header carries it too."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest

from conftest import SERVE_KEY, start_server

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    os.environ["LOCALRUN_MAX_BODY"], os.environ["LOCALRUN_HEADER_TIMEOUT"] = "8", "2"
    try:
        srv = start_server(smollm2, tmp_path_factory.mktemp("limits-home"), "--ctx", "1024", "--api-key", SERVE_KEY)
    finally:
        del os.environ["LOCALRUN_MAX_BODY"], os.environ["LOCALRUN_HEADER_TIMEOUT"]
    yield srv
    assert srv.stop() == 130


def post(server, path: str, body, key: str = SERVE_KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **kw.pop("headers", {})}
    content = body if isinstance(body, (bytes, str)) or hasattr(body, "__next__") else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json", **headers}, timeout=60, **kw)


def test_an_upload_for_api_create_is_not_capped(server):
    """A LoRA adapter is often larger than the cap: /api/blobs streams it to disk and checks its digest, it is not
    held in memory as a request's JSON is."""
    import hashlib

    blob = os.urandom(9 << 20)  # over this server's 8 MiB
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    r = httpx.post(f"{server.url}/api/blobs/{digest}", content=blob, headers={"Authorization": f"Bearer {SERVE_KEY}"}, timeout=60)
    assert r.status_code == 201, r.text
    assert httpx.head(f"{server.url}/api/blobs/{digest}", headers={"Authorization": f"Bearer {SERVE_KEY}"}).status_code == 200


def test_a_body_over_the_cap_is_a_413_and_the_server_keeps_answering(server):
    big = json.dumps({"model": "x", "messages": [{"role": "user", "content": "a" * (50 << 20)}]}).encode()
    health: list[int] = []

    def poll():
        for _ in range(5):
            health.append(httpx.get(server.url + "/health", timeout=5).status_code)

    poller = threading.Thread(target=poll)
    poller.start()
    r = post(server, "/v1/chat/completions", big)
    assert r.status_code == 413 and "limit of 8 MiB" in r.json()["error"]["message"]
    r = post(server, "/api/chat", (chunk for chunk in [big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)]))  # chunked
    assert r.status_code == 413 and "LOCALRUN_MAX_BODY" in r.json()["error"]
    poller.join()
    assert health == [200] * 5

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # a length never sent: refused from the header
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SERVE_KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 413")


def test_a_connection_that_never_finishes_its_headers_is_closed(server):
    conns = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=15)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more: a slow-loris client
        conns.append(s)
    try:
        deadline = time.monotonic() + 15
        for s in conns:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(100) == b""  # closed by the server
    finally:
        for s in conns:
            s.close()
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("body, says", [
    ('{"model": "\\ud800x", "messages": [{"role": "user", "content": "hi"}]}', "surrogate"),
    ('{"messages": [{"role": "user", "content": "hi \\udc00"}]}', "surrogate"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN is not a JSON value"),
    ('{"messages": [{"role": "user"}]}', "needs its content"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}', "'max_tokens'"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e20}', "'max_tokens'"),
    ('{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "'stream'"),
    ('{"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}', "'logprobs'"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": "0.5"}', "'temperature'"),
])
def test_bad_values_are_400s_naming_them(server, body, says):
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("path, body", [
    ("/api/chat", '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'),
    ("/v1/embeddings", '{"input": "x \\ud800"}'),
    ("/api/embed", '{"model": "x", "input": "\\udfff"}'),
])
def test_a_lone_surrogate_is_a_400_on_every_endpoint(server, path, body):
    r = post(server, path, body)
    assert r.status_code == 400 and "surrogate" in r.text, r.text


def test_seed_minus_one_is_random_and_the_key_scheme_any_case(server):
    outs = set()
    for key_header in ({"Authorization": f"bearer {SERVE_KEY}"}, {"Authorization": f"BEARER  {SERVE_KEY}"}, {"x-api-key": SERVE_KEY}):
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HI, "seed": -1, "temperature": 1.5, "max_tokens": 12},
                       headers=key_header, timeout=60)
        assert r.status_code == 200, r.text
        outs.add(r.json()["choices"][0]["message"]["content"])
    assert len(outs) > 1  # -1: a new seed each time
    assert post(server, "/v1/chat/completions", {"messages": HI}, key="wrong").status_code == 401
