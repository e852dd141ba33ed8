"""Clients of a localrun server, on the standard library: the CLI's client path imports neither llama_cpp,
numpy nor the server stack, so a `run` against a warm resident server starts as fast as Python does.

`Client` speaks to a server's own endpoints (ps, stop) over TCP or the resident server's Unix socket;
`resident_run` sends a run request to the resident server for this LOCALRUN_HOME, starting it in the
background first when none answers, and streams the engine's responses back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from ...errors import LocalrunError, Phrase
from .http1 import Connection, Response, Unanswered

START_TIMEOUT_S = 60.0
# A server silent this long before the answer starts gets one line on stderr saying what is being waited for.
PATIENCE_S = 5.0


def idle_exit_s() -> float:
    """How long the resident server stays up with no model loaded (LOCALRUN_SERVER_IDLE_S, default 10 s)."""
    try:
        return max(0.0, float(os.environ.get("LOCALRUN_SERVER_IDLE_S", "10")))
    except ValueError:
        return 10.0


class RemoteError(LocalrunError):
    """A failure the server reported, with the exit code the same failure has in-process."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class ServerDeclined(Exception):
    """The resident server cannot take this request (another build, busy): run it in this process."""


class Client:
    """JSON requests to a server: TCP (host, port) or, with `socket_path`, the resident server's socket."""

    def __init__(self, host: str = "127.0.0.1", port: int = 11435, api_key: Optional[str] = None, *,
                 socket_path: Optional[Path] = None, timeout: Optional[float] = 30.0):
        self.host, self.port, self.api_key, self.socket_path, self.timeout = host, port, api_key, socket_path, timeout

    @property
    def address(self) -> str:
        return f"unix:{self.socket_path}" if self.socket_path else f"http://{self.host}:{self.port}"

    def connection(self, timeout: Optional[float] = None) -> Connection:
        timeout = timeout if timeout is not None else self.timeout
        if self.socket_path is not None:
            return Connection(path=str(self.socket_path), timeout=timeout)
        return Connection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> Any:
        return self.call("GET", path, None)[1]

    def post(self, path: str, body: dict) -> Any:
        return self.call("POST", path, body)[1]

    def call(self, method: str, path: str, body: Optional[dict], *, check: bool = True) -> tuple[int, Any]:
        conn = self.connection()
        try:
            response = self.send(conn, method, path, body)
            raw = response.read()
        finally:
            conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            raise LocalrunError(f"{self.address} did not answer as a localrun server (HTTP {response.status})") from None
        if check and response.status >= 400:
            message = data.get("error") if isinstance(data, dict) else None
            message = message.get("message") if isinstance(message, dict) else message
            raise LocalrunError(f"the server at {self.address} answered {response.status}: {message or raw[:200]!r}")
        return response.status, data

    def send(self, conn: Connection, method: str, path: str, body: Optional[dict], *, wait: bool = False) -> Response:
        """Send a request and read its answer's headers; `wait`: for as long as the server works on it (see
        Connection.request), where a small request times out."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            return conn.request(method, path, None if body is None else json.dumps(body).encode(), headers, wait=wait)
        except (ConnectionRefusedError, FileNotFoundError):
            raise NoServer(f"no localrun server at {self.address}: start one with `localrun serve`") from None
        except OSError as exc:
            if self.socket_path is not None and isinstance(exc, (BrokenPipeError, ConnectionResetError, Unanswered)):
                # The background server took the connection as it was ending (its idle exit, `stop --server`) and
                # closed it unanswered: as good as gone, so callers start a new one or say none runs. (Over TCP,
                # whatever closed it, a proxy or a crash, is said as it is.)
                raise NoServer(f"the localrun server at {self.address} was ending: run the command again") from None
            raise LocalrunError(f"cannot reach the server at {self.address}: {exc.strerror or exc}") from None


class NoServer(LocalrunError):
    """Nothing listens at the address."""


# -- the resident server ---------------------------------------------------------------------------


def resident() -> Client:
    from ...store.paths import server_socket

    return Client(socket_path=server_socket())


def resident_run(model: str, *, load: dict, request: dict, keep_alive: float, source: str,
                 on_notice: Callable[[str], None]) -> Iterator:
    """The responses to a run request from the resident server (started if none answers). Raises
    ServerDeclined when it should run here instead, RemoteError for what the server refused."""
    items = resident_stream("/api/run", model, load=load, request=request, keep_alive=keep_alive, source=source,
                            on_notice=on_notice)  # connects now: ServerDeclined is raised here, not at the first item
    return _responses(items)


def _responses(items: Iterator[dict]) -> Iterator:
    from ...engine.types import Progress
    from .. import Response, Stats

    for item in items:
        stats = Stats(**item["stats"]) if item.get("stats") else None
        if stats is not None and item.get("threads"):
            stats.threads = item["threads"]  # the server's CPU threads, for --verbose (beside the stats on the wire)
        progress = Progress(**item["progress"]) if item.get("progress") else None  # a long prompt's, as in-process
        yield Response(text=item["text"], tokens=item["tokens"], finish_reason=item.get("finish_reason"),
                       stats=stats, error=item.get("error_text"), thinking=item.get("thinking", ""), progress=progress)


def resident_stream(path: str, model: str, *, load: dict, request: dict, keep_alive: float, source: str,
                    on_notice: Callable[[str], None]) -> Iterator[dict]:
    """The items the resident server streams for a request to `path` (started if none answers), notices
    passed to `on_notice`. Raises ServerDeclined when it should be answered here instead, RemoteError for what
    the server refused or failed, LocalrunError when the server went away in the middle."""
    if os.path.exists(model):  # a file: the server's working folder is not this one
        model = os.path.abspath(model)
    conn, response = _open(path, model, load, request, keep_alive, source, on_notice)
    return _items(conn, response, on_notice)


class _Patience:
    """While the client waits on a silent server (loading a model, evaluating a long prompt): after
    PATIENCE_S, one line through `notice` says what for, so that a long wait reads as work, not a hang. The
    wait itself has no limit: only a server that is gone (its socket closed) ends it."""

    def __init__(self, notice: Callable[[str], None], message: str):
        self.over = threading.Event()
        self.thread = threading.Thread(target=lambda: self.over.wait(PATIENCE_S) or notice(message), daemon=True)
        self.thread.start()

    def end(self) -> None:
        """Before anything else is shown: a line being written is finished first."""
        self.over.set()
        self.thread.join()


def _open(path: str, model: str, load: dict, request: dict, keep_alive: float, source: str,
          on_notice: Callable[[str], None]) -> tuple[Connection, Response]:
    from .identity import build_identity

    client = resident()
    body = {"identity": build_identity(), "model": model, "load": load, "keep_alive": keep_alive, "request": request}
    pulled = restarted = False
    for _ in range(5):  # a server that is stopping, or that went away between connecting and answering
        conn = _connect_or_start(client, keep_alive, on_notice)
        patience = _Patience(on_notice, f"waiting for the background server to load {os.path.basename(model)}; Ctrl-C stops")
        try:
            response = client.send(conn, "POST", path, body, wait=True)  # as long as the load takes
        except (NoServer, LocalrunError):
            conn.close()
            _wait_gone(client)
            continue
        except BaseException:  # Ctrl-C: the server sees the request's end now, not at this process's
            conn.close()
            raise
        finally:
            patience.end()
        if response.status == 200:
            return conn, response
        try:
            answer = json.loads(response.read())
        except (ValueError, OSError):
            answer = {"error": f"the resident server answered HTTP {response.status}", "exit": 1}
        finally:
            conn.close()
        code = answer.get("code")
        if code == "stopping":
            _wait_gone(client)
            continue
        if code == "other_build" and not restarted:
            if not _stop_if_idle(client):
                raise ServerDeclined("the background server was started by another localrun build (or with other settings) "
                                "and is busy: answering in this process")
            restarted = True
            continue
        if code == "models_busy":  # every model there is answering and this one does not fit beside them
            raise ServerDeclined(f"the background server cannot take this model now ({answer.get('error')}): answering in this process")
        if code == "model_not_found" and not pulled:
            from ... import hub

            hub.ensure_local(model, source=source)  # as in-process: pull it here (progress on stderr), or fail the same way
            pulled = True
            continue
        raise RemoteError(answer.get("error") or f"the resident server answered HTTP {response.status}", int(answer.get("exit") or 1))
    raise LocalrunError(Phrase("the background server keeps going away: run with {keep_alive} 0, and see its log in {log}",
                               log=_log_path()))


def _log_path() -> Path:
    from ...store.paths import logs_dir

    return logs_dir() / "server.log"


def _items(conn: Connection, response: Response, notice: Callable[[str], None]) -> Iterator[dict]:
    """The streamed items, waiting as long as the server takes for each (a long prompt is evaluated before
    the first one comes); a closed connection before the end is a server that went away."""
    # Until the server says anything (a notice, such as a wait for a slot, says what it is doing itself).
    patience: Optional[_Patience] = _Patience(notice, "waiting for the first token: the server is evaluating the prompt "
                                                      "(a long one takes a while on a CPU); Ctrl-C stops")
    try:
        while True:
            try:
                line = response.readline()
            except OSError:  # ProtocolError too: the server went away
                line = b""
            finally:
                if patience is not None:
                    patience.end()
                    patience = None
            if not line:
                break
            item = json.loads(line)
            if "notice" in item:
                notice(item.pop("notice"))
                if not item:
                    continue
            if "error" in item:
                raise RemoteError(item["error"], int(item.get("exit") or 1))
            if item.get("end"):
                return
            yield item
        raise LocalrunError(
            f"the localrun server stopped in the middle of the answer (see {_log_path()}); the next run starts a new one"
        )
    finally:
        conn.close()  # early (Ctrl-C, a closed pipe): the server sees the disconnect and stops generating


def _connect_or_start(client: Client, keep_alive: float, notice: Callable[[str], None]) -> Connection:
    conn = _try_connect(client)
    if conn is not None:
        return conn
    from filelock import FileLock

    from ...store.paths import run_dir

    # Two clients racing to start a server: the lock makes the second find the first one's server.
    with FileLock(str(run_dir() / "start.lock"), timeout=START_TIMEOUT_S):
        conn = _try_connect(client)
        if conn is not None:
            return conn
        proc = _spawn(client.socket_path, keep_alive, notice)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _try_connect(client)
            if conn is not None:
                return conn
            if proc.poll() is not None:
                break
            time.sleep(0.02)
    raise LocalrunError(Phrase("the background server did not start (see {log}): use {keep_alive} 0 to run without it",
                               log=_log_path()))


def _try_connect(client: Client) -> Optional[Connection]:
    conn = client.connection(timeout=None)
    try:
        conn.connect()
        return conn
    except (FileNotFoundError, ConnectionRefusedError):  # none, or a dead server's socket (replaced on start)
        conn.close()
        return None


def _spawn(socket_path: Path, keep_alive: float, notice: Callable[[str], None]) -> subprocess.Popen:
    """Start the resident server detached from this terminal (its own session, output to the log)."""
    from ...store.paths import run_dir

    log_path = _log_path()
    code = "import sys; from localrun.cli import main; sys.argv[0] = 'localrun'; main()"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "serve", "--socket", str(socket_path), "--keep-alive", str(keep_alive),
             "--exit-when-idle", str(idle_exit_s())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, cwd="/",
        )
    told = run_dir() / "told"
    if not told.exists():
        told.touch()
        notice(f"started a localrun server in the background: models stay loaded after use (--keep-alive, default 5m); "
               f"`localrun stop --server` ends it, --keep-alive 0 runs without it; log: {log_path}")
    return proc


def _stop_if_idle(client: Client) -> bool:
    """End the server if nothing is running on it (checked by the server itself, atomically), and wait
    until its socket is gone; False when it is busy."""
    try:
        status, _ = client.call("POST", "/api/stop", {"server": True, "if_idle": True}, check=False)
    except NoServer:
        return True
    if status == 409:
        return False
    _wait_gone(client)
    return True


def _wait_gone(client: Client, timeout: float = 30.0) -> None:
    """Until nothing answers on the socket (a server that is stopping), so that the next start is ours."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = _try_connect(client)
        if conn is None:
            return
        conn.close()
        time.sleep(0.05)
    raise LocalrunError(f"the localrun server at {client.address} did not stop: end it with `localrun stop --server`")
