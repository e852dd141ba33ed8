"""`localrun serve`, the process: the command line's model loaded, the socket bound (TCP, or the resident server's
Unix socket), then uvicorn serving the app (serve.asgi.build_app) until Ctrl-C/SIGTERM, `stop --server`, or (the
resident server) an idle spell. The routes, a module per dialect, are in serve/routes; what they share in
serve.endpoint; the model pool and its options in serve.service."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..errors import LocalrunError, Phrase, UsageError
from ..runtime.client.identity import build_identity
from ..runtime.workers import leave_if_workers_lost
from .asgi import build_app
from .guards import header_timeout
from .service import ServeOptions, Service
from .stream import end_all

__all__ = ["ServeOptions", "Service", "bind", "bind_unix", "serve"]


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(Phrase("cannot listen on {host}:{number}: {why}: pick another {port} or stop what uses it", host=host,
                                number=port, why=exc.strerror)) from None
    sock.listen(2048)
    return sock


def bind_unix(path) -> socket.socket:
    """The resident server's socket, 0600 in its 0700 folder. A socket file nobody answers on (a server
    that died) is replaced; a live one is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        raise LocalrunError(f"a localrun server already listens on {path}: stop it with `localrun stop --server`")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(256)
    return sock


def serve(options: ServeOptions, *, host: str, port: int, socket_path=None, on_ready=None, on_notice=None) -> None:
    """Load the command line's model (if any), bind (TCP, or the resident server's Unix socket), then serve
    until Ctrl-C/SIGTERM, `stop --server`, or (the resident server) an idle spell; in-flight streams get a
    few seconds to finish."""
    options.socket = socket_path is not None
    if options.socket:
        build_identity()  # fixed now, from the environment the server starts with
    service = Service(options, on_notice=on_notice)
    sock, inode, server = None, None, None
    try:
        resident = service.preload() if options.model else None
        sock = bind_unix(socket_path) if socket_path else bind(host, port)
        bound = None if socket_path else sock.getsockname()[1]
        inode = os.stat(socket_path).st_ino if socket_path else None
        app = build_app(service, on_started=(lambda: on_ready(bound, resident)) if on_ready else None)
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3, lifespan="on",
                                http=header_timeout(AutoHTTPProtocol), ssl_certfile=options.ssl_certfile, ssl_keyfile=options.ssl_keyfile)
        server = Server(config, service)
        service.exit = lambda: setattr(server, "should_exit", True)
        if options.exit_when_idle is not None:
            threading.Thread(target=_exit_when_idle, args=(server, service, options.exit_when_idle), name="localrun-idle",
                             daemon=True).start()
        server.run(sockets=[sock])
    finally:
        if socket_path and inode is not None:  # first, so that the next client starts a server at once
            with contextlib.suppress(OSError):
                if os.stat(socket_path).st_ino == inode:  # not a successor's socket
                    os.unlink(socket_path)
        if sock is not None:
            sock.close()
        service.pool.close()
        leave_if_workers_lost(130 if server is not None and server.ctrl_c else 0)
    if server is not None and server.ctrl_c:
        # uvicorn re-raises the SIGINT it caught, which ends in KeyboardInterrupt (exit 130) unless SIGINT
        # was ignored when we started (a background job of a script): it stopped on Ctrl-C all the same.
        raise KeyboardInterrupt


class Server(uvicorn.Server):
    """uvicorn's server, stopping as localrun stops: the open requests end first (503 JSON, or an error event on a
    stream), when the step under way ends; a second signal during a step stops at once."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service
        self.signals: list[bool] = []  # the stop signals caught: whether each was Ctrl-C (SIGINT)

    @property
    def ctrl_c(self) -> bool:
        """Whether a stop signal caught was Ctrl-C (the process then exits 130)."""
        return any(self.signals)

    def handle_exit(self, sig, frame) -> None:
        # End the open requests first, so that uvicorn's graceful wait sees them finish: past it, uvicorn cancels them
        # and logs a traceback.
        pool = self.service.pool
        if self.signals and pool.stepping():
            # A second signal while a step is under way (a long prompt's chunk, an image): stop at once. llama.cpp's
            # step cannot be interrupted and tearing down beside it can crash: every open answer gets its end now,
            # and the process leaves without waiting (its files are written whole or not at all).
            end_all("the server was stopped: retry later")
            print("stopped at once: the step under way was not waited for", file=sys.stderr, flush=True)
            threading.Timer(0.5, os._exit, args=(130 if sig == signal.SIGINT or any(self.signals) else 0,)).start()
            return
        if pool.busy():
            print("stopping: the open requests end when the step under way ends (a second Ctrl-C stops at once)",
                  file=sys.stderr, flush=True)
        self.signals.append(sig == signal.SIGINT)
        self.service.stopping = True
        pool.request_stop()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        # The requests end (503, an error event) when the step under way ends, which for a long prompt's chunk can
        # outlast uvicorn's grace (it would cut them: a plain-text 500, an empty stream): wait for that step first
        # (a second Ctrl-C stops waiting).
        while self.service.pool.stepping() and not self.force_exit:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


def _exit_when_idle(server: Server, service: Service, after: float) -> None:
    """The resident server: ends once no model has been loaded nor any request made for `after` seconds."""
    while not server.should_exit:
        if service.end_if_idle(after=after):
            service.end()
        time.sleep(0.25)
