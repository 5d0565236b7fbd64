"""HTTP/1.1 over a raw socket, for tests of what the connection layer does with what a client library would
never send. Reads block until bytes arrive (a generous socket timeout only guards against a hang)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

GUARD_S = 60.0  # a read that waits this long means the server never answered: the test fails, never hangs


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_headers: list[tuple[str, str]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        err = self.json()["error"]
        assert isinstance(err, dict)
        return err


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(GUARD_S)
    return s


class Reader:
    """Reads responses one after another from one socket (pipelining keeps them in order)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def reply(self) -> Reply:
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                raise EOFError(f"connection closed before a full response head: {self.buf[:200]!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        raw = [(k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:])]
        headers = dict(raw)
        if headers.get("transfer-encoding") == "chunked":
            body = self._chunked()
        else:
            n = int(headers.get("content-length", "0"))
            while len(self.buf) < n:
                if not self._more():
                    raise EOFError("connection closed inside a response body")
            body, self.buf = self.buf[:n], self.buf[n:]
        return Reply(status, headers, body, raw)

    def _need(self, n: int) -> bool:
        while len(self.buf) < n:
            if not self._more():
                return False
        return True

    def _chunked(self) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in self.buf:
                if not self._more():
                    return body  # cut mid-stream: what arrived
            size_line, self.buf = self.buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            if not self._need(size + 2):
                return body + self.buf
            body += self.buf[:size]
            self.buf = self.buf[size + 2:]
            if size == 0:
                return body

    def at_eof(self) -> bool:
        """True when the server closed the connection with nothing more to read (reset counts as closed)."""
        try:
            return not self.buf and not self._more()
        except ConnectionResetError:
            return True


def exchange(port: int, data: bytes) -> tuple[Reply, bool]:
    """Send `data` on a new connection; the first response, and whether the server then closed the connection
    (looked for only after a `Connection: close` answer: a kept-alive one stays open)."""
    with connect(port) as s:
        s.sendall(data)
        r = Reader(s)
        reply = r.reply()
        return reply, reply.headers.get("connection") == "close" and r.at_eof()


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
