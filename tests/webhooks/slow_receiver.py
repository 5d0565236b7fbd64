"""Misbehaving webhook receivers on 127.0.0.1, written on raw sockets so every byte's timing is the test's:
one that trickles its answer (status line and headers, or the body) a byte at a time, one that floods a huge
body. Each connection is recorded: when it arrived, whether the server finished its answer or the client
hung up first, how many bytes were written."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["trickle_head", "trickle_body", "flood"]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"


@dataclass
class Conn:
    arrived: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # "finished": the whole answer was written; "hung up": the client closed first
    written: int = 0


@dataclass
class Slow:
    url: str
    conns: list[Conn] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    open_now: int = 0
    most_open: int = 0  # the most connections open at once
    stop: threading.Event = field(default_factory=threading.Event)

    def count(self) -> int:
        with self.lock:
            return len(self.conns)


def _read_request(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def slow_receiver(mode: Mode, *, interval_s: float = 0.5, length: int = 1 << 28) -> Iterator[Slow]:
    """`trickle_head`: the status line and headers a byte every `interval_s`; `trickle_body`: the head at once,
    then a `length`-byte body a byte every `interval_s`; `flood`: a `length`-byte body as fast as it goes."""
    rx: Slow | None = None

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            assert rx is not None
            sock: socket.socket = self.request
            conn = Conn()
            _read_request(sock)
            with rx.lock:
                rx.conns.append(conn)
                rx.open_now += 1
                rx.most_open = max(rx.most_open, rx.open_now)
            conn.arrived.set()
            try:
                head = HEAD % length
                if mode == "flood":
                    sock.sendall(head)
                    block = b"x" * 65536
                    while conn.written < length and not rx.stop.is_set():
                        sock.sendall(block)
                        conn.written += len(block)
                else:
                    if mode == "trickle_body":
                        sock.sendall(head)
                    todo = len(head) if mode == "trickle_head" else length
                    for i in range(todo):
                        if rx.stop.wait(interval_s):
                            break
                        sock.sendall(head[i:i + 1] if mode == "trickle_head" else b"x")
                        conn.written += 1
                conn.outcome = "finished"
            except OSError:
                conn.outcome = "hung up"
            finally:
                with rx.lock:
                    rx.open_now -= 1
                conn.ended.set()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    rx = Slow(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rx
    finally:
        rx.stop.set()
        server.shutdown()
        server.server_close()
