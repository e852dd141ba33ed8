"""The client's HTTP/1.1 reader (runtime/client/http1.py): whatever the chunking, lines and bodies come back
exactly; an answer cut short is a ProtocolError (an OSError: the client's "the server went away"), never
a hang or a silently short answer. The real server end of it is exercised by every run through the
background server (tests/cli/test_resident_run.py)."""

from __future__ import annotations

import io
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.runtime.client.http1 import Connection, ProtocolError, Response

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"


def chunked(body: bytes, cuts: list[int]) -> bytes:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    out = b""
    for a, b in zip(points, points[1:]):
        if b > a:
            out += f"{b - a:x}\r\n".encode() + body[a:b] + b"\r\n"
    return out + b"0\r\n\r\n"


def reader(raw: bytes) -> Response:
    return Response(io.BufferedReader(io.BytesIO(raw)))


lines_st = st.lists(st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=30).map(lambda t: t + "\n"), max_size=8)


@settings(max_examples=200, deadline=None)
@given(lines=lines_st, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10), tail=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=5))
def test_lines_come_back_exactly_whatever_the_chunks(lines, cuts, tail):
    body = ("".join(lines) + tail.replace("\n", "")).encode()
    r = reader(HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, cuts))
    got = []
    while line := r.readline():
        got.append(line)
    assert b"".join(got) == body
    assert all(g.endswith(b"\n") for g in got[:-1])
    assert r.readline() == b"" and r.read() == b""


@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_read_takes_the_whole_body_by_length_chunks_or_close(body, cuts):
    assert reader(HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, cuts)).read() == body
    assert reader(HEAD + f"content-length: {len(body)}\r\n\r\n".encode() + body + b"trailing junk").read() == body
    assert reader(HEAD + b"\r\n" + body).read() == body  # neither: to the close


def test_an_answer_cut_short_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        reader(HEAD + b"content-length: 10\r\n\r\nabc").read()
    whole = chunked(b'{"text": "hi"}\n{"end": true}\n', [7])
    r = reader(HEAD + b"transfer-encoding: chunked\r\n\r\n" + whole[:12])
    with pytest.raises(ProtocolError):
        while r.readline():
            pass
    with pytest.raises(ProtocolError):
        reader(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ProtocolError):
        reader(HEAD)  # the headers never end
    assert reader(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}").status == 404


def test_a_request_goes_out_as_http11_over_a_unix_socket(tmp_path):
    path = str(tmp_path / "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    seen = {}

    def serve():
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 7:
                data += conn.recv(4096)
            seen["request"] = data
            conn.sendall(HEAD + b"content-length: 2\r\n\r\nok")

    t = threading.Thread(target=serve)
    t.start()
    conn = Connection(path=path, timeout=10)
    try:
        response = conn.request("POST", "/api/run", b'{"a": 1}', {"Content-Type": "application/json"})
        assert (response.status, response.read()) == (200, b"ok")
    finally:
        conn.close()
        t.join(10)
        server.close()
    head, body = seen["request"].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /api/run HTTP/1.1\r\n") and b"Content-Length: 8" in head and body == b'{"a": 1}'


def test_a_background_server_that_closes_unanswered_reads_as_none(tmp_path):
    """A server ending (its idle exit, `stop --server`) can take a connection and close it without a word: at
    the background server's socket that is no server (ps lists nothing, stop says none runs, run starts one),
    not "cannot reach the server: Broken pipe" (seen in CI: a race of `stop --server` with a client)."""
    import json

    from conftest import run_cli

    from localrun.runtime.client import Client, NoServer
    from localrun.store.paths import server_socket

    path = server_socket()
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.1)  # a blocking accept() does not wake when the socket is closed
    taken, done = [], threading.Event()

    def close_each():
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            taken.append(1)
            conn.close()

    t = threading.Thread(target=close_each, daemon=True)
    t.start()
    try:
        with pytest.raises(NoServer, match="was ending"):
            Client(socket_path=path).get("/api/version")
        ps = run_cli("ps", "--json")
        assert ps.returncode == 0 and json.loads(ps.stdout) == [], ps.stderr
        stop = run_cli("stop", "--server")
        assert stop.returncode == 0 and "no localrun server is running" in stop.stderr, stop.stderr
        assert len(taken) >= 3  # each one reached this stand-in and was closed unanswered
    finally:
        done.set()
        t.join(10)
        server.close()
        path.unlink()
