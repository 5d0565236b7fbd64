"""A webhook receiver for tests: an HTTP server on 127.0.0.1 that records every request and answers with the
next status of a script (the last one repeats)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    statuses: list[int]
    location: str = "/elsewhere"  # for a 3xx answer
    got: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, req: Received) -> int:
        with self.lock:
            self.got.append(req)
            i = min(len(self.got), len(self.statuses)) - 1
            return self.statuses[i]

    def count(self) -> int:
        with self.lock:
            return len(self.got)


@contextmanager
def receiver(*statuses: int) -> Iterator[Receiver]:
    rec: Receiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            assert rec is not None
            status = rec.answer(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", rec.location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec = Receiver(f"http://127.0.0.1:{server.server_address[1]}", list(statuses))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
