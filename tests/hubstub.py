"""A loopback stand-in for the Hugging Face Hub, enough for huggingface_hub's model_info and hf_hub_download.

It serves in-memory repositories the test defines:
    GET  /api/models/{repo}[/revision/{rev}]   model info; siblings carry size/blobId/lfs only with ?blobs=true
    HEAD /{repo}/resolve/{rev}/{file}          X-Repo-Commit, X-Linked-Etag, X-Linked-Size, ETag, Content-Length
    GET  /{repo}/resolve/{rev}/{file}          the bytes, honouring `Range: bytes=N-` with 206
and answers unknown repositories like the real Hub (404 + X-Error-Code: RepoNotFound). It cannot serve Xet: only
files marked `xet=True` get the Hub's Xet headers (so a client can tell them apart), and their bytes still come over
plain HTTP. With `cdn=True`, LFS files are redirected (302) to a second loopback server,
as the real Hub redirects to its CDN.

Faults are queued per file and consumed by GETs of that file, in order: `cut` (send N bytes then drop the
connection), `fail` (an HTTP status), `corrupt` (a full body with one byte flipped, under the right headers),
`hold` (send N bytes, then wait for the test to release the rest), `ignore_range` (answer 200 with the whole file
to a Range request, as some CDNs do). Every request is logged in `stub.log`.

`hub_stub` is the pytest fixture: it starts a stub and points huggingface_hub (in this process, and any subprocess
through the environment) at it, with isolated HF_HOME and LOCALRUN_HOME under tmp_path.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional, Union
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest


@dataclass
class StubFile:
    name: str
    data: bytes
    lfs: bool = True
    xet: bool = False  # announce Xet storage in the headers, as the Hub does for most large files

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def lfs_pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass
class StubRepo:
    repo_id: str
    commit: str
    files: dict[str, StubFile]
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Optional[str]:
        if revision in self.branches:
            return self.branches[revision]
        if len(revision) >= 7 and self.commit.startswith(revision):
            return self.commit
        return None


@dataclass
class Logged:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    server: str  # "hub" or "cdn"


class HubStub:
    def __init__(self, cdn: bool = False):
        self.repos: dict[str, StubRepo] = {}
        self.log: list[Logged] = []
        self._faults: dict[str, list[tuple[str, Any]]] = {}
        self._lock = threading.Lock()
        self._hub = _Server(self, "hub")
        self._cdn = _Server(self, "cdn") if cdn else None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> HubStub:
        self._hub.start()
        if self._cdn is not None:
            self._cdn.start()
        return self

    def stop(self) -> None:
        self._hub.stop()
        if self._cdn is not None:
            self._cdn.stop()

    def __enter__(self) -> HubStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self._hub.url

    # -- content ------------------------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: Union[dict[str, bytes], list[StubFile]], commit: Optional[str] = None) -> StubRepo:
        items = [StubFile(n, d) for n, d in files.items()] if isinstance(files, dict) else list(files)
        commit = commit or hashlib.sha1(repo_id.encode() + b"".join(f.name.encode() for f in items)).hexdigest()
        repo = StubRepo(repo_id, commit, {f.name: f for f in items}, branches={"main": commit})
        self.repos[repo_id.lower()] = repo
        return repo

    # -- faults -------------------------------------------------------------------------------------------------

    def cut(self, filename: str, after: int, times: int = 1) -> None:
        """The next `times` GETs of `filename` send `after` bytes of the body, then drop the connection."""
        self._queue(filename, ("cut", after), times)

    def fail(self, filename: str, status: int = 503, times: int = 1) -> None:
        """The next `times` GETs of `filename` answer `status`."""
        self._queue(filename, ("fail", status), times)

    def corrupt(self, filename: str, times: int = 1) -> None:
        """The next `times` GETs of `filename` send a full-length body with one byte changed."""
        self._queue(filename, ("corrupt", 0), times)

    def hold(self, filename: str, after: int) -> threading.Event:
        """The next GET of `filename` sends `after` bytes of the body, then waits until the returned event is set."""
        release = threading.Event()
        self._queue(filename, ("hold", (after, release)), 1)
        return release

    def ignore_range(self, filename: str, times: int = 1) -> None:
        """The next `times` GETs of `filename` answer 200 with the whole file, whatever Range they ask for."""
        self._queue(filename, ("ignore_range", 0), times)

    def _queue(self, filename: str, fault: tuple[str, Any], times: int) -> None:
        with self._lock:
            self._faults.setdefault(filename, []).extend([fault] * times)

    def _next_fault(self, filename: str) -> Optional[tuple[str, Any]]:
        with self._lock:
            queue = self._faults.get(filename)
            return queue.pop(0) if queue else None

    # -- inspection ---------------------------------------------------------------------------------------------

    def requests(self, method: Optional[str] = None, contains: str = "") -> list[Logged]:
        return [r for r in self.log if (method is None or r.method == method) and contains in r.path]

    def _record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)


class _Server:
    def __init__(self, stub: HubStub, role: str):
        self.stub = stub
        self.role = role
        handler = type(f"_{role.title()}Handler", (_Handler,), {"stub": stub, "role": role})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name=f"hubstub-{role}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stub: HubStub
    role: str

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return None

    # -- routing ------------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        path = split.path
        self.stub._record(
            Logged(method, path, parse_qs(split.query), {k.lower(): v for k, v in self.headers.items()}, self.role)
        )
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if self.role == "cdn":
            # /blobs/{repo-owner}/{repo-name}/{sha}/{filename...}
            if len(parts) >= 5 and parts[0] == "blobs":
                return self._cdn_file(method, f"{parts[1]}/{parts[2]}", "/".join(parts[4:]))
            return self._json(404, {"error": "not found"})
        if len(parts) >= 4 and parts[:2] == ["api", "models"] and method == "GET":
            repo_id = f"{parts[2]}/{parts[3]}"
            revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            return self._model_info(repo_id, revision, "true" in parse_qs(split.query).get("blobs", []))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        return self._json(404, {"error": "not found"})

    # -- endpoints ----------------------------------------------------------------------------------------------

    def _repo(self, repo_id: str) -> Optional[StubRepo]:
        repo = self.stub.repos.get(repo_id.lower())
        if repo is None:
            self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        return repo

    def _repo_at(self, repo_id: str, revision: str) -> Optional[tuple[StubRepo, str]]:
        """The repo and the commit `revision` names, or None once a 404 like the Hub's has been sent."""
        repo = self._repo(repo_id)
        if repo is None:
            return None
        commit = repo.resolve(revision)
        if commit is None:
            self._json(404, {"error": f"Invalid rev id: {revision}"}, {"X-Error-Code": "RevisionNotFound"})
            return None
        return repo, commit

    def _model_info(self, repo_id: str, revision: str, blobs: bool) -> None:
        found = self._repo_at(repo_id, revision)
        if found is None:
            return
        repo, commit = found
        siblings = []
        for f in repo.files.values():
            sibling: dict = {"rfilename": f.name}
            if blobs:
                sibling["size"] = len(f.data)
                if f.lfs:
                    # Git stores an LFS pointer; blobId is the pointer's git oid, the content hash is under lfs.
                    pointer = f.lfs_pointer
                    sibling["blobId"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
                    sibling["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": len(pointer)}
                else:
                    sibling["blobId"] = f.git_sha1
            siblings.append(sibling)
        self._json(200, {"id": repo.repo_id, "modelId": repo.repo_id, "sha": commit, "private": False, "siblings": siblings})

    def _resolve(self, method: str, repo_id: str, revision: str, filename: str) -> None:
        found = self._repo_at(repo_id, revision)
        if found is None:
            return
        repo, commit = found
        f = repo.files.get(filename)
        if f is None:
            return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{f.etag}"'}
        if f.lfs:
            headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(len(f.data))})
        if f.xet:
            headers.update({"X-Xet-Hash": f.sha256, "X-Xet-Refresh-Route": f"/api/models/{repo.repo_id}/xet-read-token/{commit}"})
        if f.lfs and self.stub._cdn is not None:
            location = f"{self.stub._cdn.url}/blobs/{quote(repo.repo_id)}/{f.sha256}/{quote(f.name)}"
            self.send_response(302)
            for k, v in {**headers, "Location": location, "Content-Length": "0"}.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self._serve(method, f, headers)

    def _cdn_file(self, method: str, repo_id: str, filename: str) -> None:
        repo = self.stub.repos.get(repo_id.lower())
        f = repo.files.get(filename) if repo else None
        if f is None:
            return self._json(404, {"error": "no such blob"})
        self._serve(method, f, {"ETag": f'"{f.sha256}"'})

    def _serve(self, method: str, f: StubFile, headers: dict[str, str]) -> None:
        data = f.data
        size = len(data)
        start = 0
        fault = self.stub._next_fault(f.name) if method == "GET" else None
        range_header = self.headers.get("Range")
        if range_header and range_header.startswith("bytes=") and range_header.endswith("-"):
            start = int(range_header[len("bytes=") : -1])
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if fault and fault[0] == "ignore_range":
            start = 0
        if fault and fault[0] == "fail":
            return self._json(fault[1], {"error": "stub failure"})
        if fault and fault[0] == "corrupt":
            flip = start + (size - start) // 2
            data = data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1 :]

        self.send_response(206 if start else 200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if method == "HEAD":
            return
        body = memoryview(data)[start:]
        try:
            if fault and fault[0] == "cut":
                self.wfile.write(body[: fault[1]])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault and fault[0] == "hold":
                after, release = fault[1]
                self.wfile.write(body[:after])
                self.wfile.flush()
                release.wait(timeout=120)
                body = body[after:]
            for offset in range(0, len(body), 1 << 20):
                self.wfile.write(body[offset : offset + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (an interrupted pull)

    def _json(self, status: int, payload: dict, headers: Optional[dict[str, str]] = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


# ----------------------------------------------------------------------------------------------------------------
# Pointing huggingface_hub at an endpoint


def point_hub_at(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Make huggingface_hub talk to `endpoint`, in this process and in subprocesses.

    huggingface_hub reads HF_ENDPOINT into `constants` at import time, so the environment alone does not reach an
    already-imported module: patch the module constants too.
    """
    from huggingface_hub import close_session, constants

    endpoint = endpoint.rstrip("/")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    close_session()  # drop keep-alive connections to a previous endpoint


def isolate_hf_home(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> None:
    """A private HF_HOME (cache, token, xet cache), no token, online."""
    from huggingface_hub import constants

    hf_home.mkdir(parents=True, exist_ok=True)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_XET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_ASSETS_CACHE", str(hf_home / "assets"))
    monkeypatch.setattr(constants, "HF_XET_CACHE", str(hf_home / "xet"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub caches a registry it fetches from the endpoint; keep it inside the private home too.
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(hf_home / ".agent_harnesses.json"))


def set_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class StubEnv:
    """What the `hub_stub` fixture hands a test."""

    stub: HubStub
    home: Path  # LOCALRUN_HOME
    hf_home: Path

    @property
    def hub_cache(self) -> Path:
        return self.hf_home / "hub"

    def repo_cache(self, repo_id: str) -> Path:
        return self.hub_cache / ("models--" + repo_id.replace("/", "--"))

    def write_models_yaml(self, text: str) -> Path:
        path = self.home / "models.yaml"
        path.write_text(text, encoding="utf-8")
        return path


@pytest.fixture
def hub_stub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    home = tmp_path / "localrun-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    monkeypatch.delenv("LOCALRUN_MODELS", raising=False)
    monkeypatch.delenv("LOCALRUN_MIRROR_FIND_LINKS", raising=False)
    isolate_hf_home(monkeypatch, tmp_path / "hf-home")
    with HubStub() as stub:
        point_hub_at(monkeypatch, stub.url)
        yield StubEnv(stub=stub, home=home, hf_home=tmp_path / "hf-home")
        from huggingface_hub import close_session

        close_session()


# ----------------------------------------------------------------------------------------------------------------
# Helpers for tests


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def random_bytes(n: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes (fast, no entropy pool)."""
    import random

    return random.Random(seed).randbytes(n)


def build_wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel holding `members` (path inside the wheel -> bytes), for pip --find-links."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: hubstub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record_lines = []
    for path, data in files.items():
        import base64

        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel
