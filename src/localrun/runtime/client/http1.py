"""The HTTP/1.1 a localrun client needs, on a socket: one request per connection (Connection: close), a
JSON body, and a response read whole or line by line (Content-Length, chunked, or to the close).

Not http.client: importing it (with email's parser and ssl) costs ~30 ms, a fifth of what a `run` on a
warm server may take from start to first byte. Servers here are localrun's own (uvicorn), so the subset
is known: no redirects, no keep-alive, no TLS.
"""

from __future__ import annotations

import socket
from typing import Optional


class ProtocolError(OSError):
    """The peer did not answer in HTTP/1.1, or closed in the middle of a response."""


class Unanswered(ProtocolError):
    """The peer closed the connection before the first byte of an answer (a server that is stopping)."""


class Connection:
    """One request to (host, port) or to a Unix socket `path`. `timeout` bounds connecting, sending and (unless
    the request says `wait`) each read of the answer."""

    def __init__(self, host: str = "localhost", port: int = 80, *, path: Optional[str] = None, timeout: Optional[float] = None):
        self.host, self.port, self.path, self.timeout = host, port, path, timeout
        self.sock: Optional[socket.socket] = None

    def connect(self) -> None:
        if self.sock is not None:
            return
        if self.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock = sock

    def request(self, method: str, target: str, body: Optional[bytes], headers: dict[str, str], *,
                wait: bool = False) -> "Response":
        """Send the request and read the answer's headers. `wait`: the answer may take as long as the server
        needs (a model loading, a long prompt evaluated before the first token), so no read times out; a
        server that goes away still ends the wait, as its end of the socket closes."""
        self.connect()
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}", "Connection: close",
                 *(f"{k}: {v}" for k, v in headers.items())]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        if wait:
            self.sock.settimeout(None)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        return Response(self.sock.makefile("rb"))

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


class Response:
    def __init__(self, raw):
        self.raw = raw
        status_line = raw.readline(65537)
        if not status_line:
            raise Unanswered("the connection closed before any answer")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 answer: {status_line[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        while True:
            line = raw.readline(65537)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ProtocolError("the connection closed in the middle of the headers")
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self.left: Optional[int] = int(length) if length is not None and not self.chunked else None
        self.chunk_left = 0  # chunked: bytes left in the current chunk
        self.done = False

    def _next_chunk(self) -> bool:
        """Chunked: start the next chunk; False (and done) at the last, empty one."""
        size_line = self.raw.readline(1024)
        if not size_line:
            raise ProtocolError("the connection closed in the middle of a chunked answer")
        self.chunk_left = int(size_line.split(b";")[0].strip() or b"0", 16)
        if self.chunk_left == 0:
            self.done = True
        return not self.done

    def _take(self, read, limit: int) -> bytes:
        """`read(n)` (the file's read or readline) of up to `limit` bytes of the body; b'' at its end."""
        if self.done:
            return b""
        if self.chunked:
            if self.chunk_left == 0 and not self._next_chunk():
                return b""
            data = read(min(limit, self.chunk_left))
            if not data:
                raise ProtocolError("the connection closed in the middle of a chunk")
            self.chunk_left -= len(data)
            if self.chunk_left == 0:
                self.raw.readline(8)  # the chunk's CRLF
            return data
        if self.left is not None:
            if self.left == 0:
                self.done = True
                return b""
            data = read(min(limit, self.left))
            if not data:
                raise ProtocolError("the connection closed in the middle of the answer")
            self.left -= len(data)
            return data
        data = read(limit)  # to the close
        if not data:
            self.done = True
        return data

    def readline(self) -> bytes:
        """The next line of the body (with its newline), or b'' at its end."""
        out = bytearray()
        while not out.endswith(b"\n"):
            data = self._take(self.raw.readline, 1 << 20)
            if not data:
                break
            out += data
        return bytes(out)

    def read(self) -> bytes:
        """The rest of the body."""
        out = bytearray()
        while data := self._take(self.raw.read, 1 << 16):
            out += data
        return bytes(out)
