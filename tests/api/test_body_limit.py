"""The body limit: declared and counted, answered with a 413 the client reads, never a reset.

Socket tests run the reference app under uvicorn in a subprocess (sluicegate.testing.refserver).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from sluicegate.api.middleware.body_limit import BodyLimitMiddleware
from sluicegate.config import Config, LimitsConfig
from sluicegate.testing.refserver import RefServer, running
from tests.conftest import make_client, wait_ready

MIB = 1 << 20
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    with running(tmp_path_factory.mktemp("refserver")) as srv:
        yield srv


def _chunks(total: int, size: int = MIB) -> Iterator[bytes]:
    block = b"x" * size
    while total > 0:
        yield block[:total]
        total -= size


def _recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# -- over a real socket -------------------------------------------------------------------------------------


def test_declared_100mb_gets_a_413_the_client_reads(server: RefServer) -> None:
    headers = {**JSON, "content-length": str(100 * MIB)}
    r = httpx.post(f"{server.url}/v1/generate", content=_chunks(100 * MIB), headers=headers, timeout=60)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["type"] == "body_too_large"
    assert f"limit of {LimitsConfig().max_body_bytes} bytes" in err["message"]
    assert str(100 * MIB) in err["message"]
    assert err["request_id"] == r.headers["x-request-id"]
    assert r.headers["connection"] == "close"


def test_chunked_100mb_gets_a_413_the_client_reads(server: RefServer) -> None:
    r = httpx.post(f"{server.url}/v1/generate", content=_chunks(100 * MIB), headers=JSON, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "body_too_large"
    assert "more than 1048576 bytes" in r.json()["error"]["message"]


def test_the_413_comes_before_the_body_is_sent_and_the_send_is_not_reset(server: RefServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (20 * MIB)
        )
        early = s.recv(65536)  # answered at once: nothing of the body has been sent
        assert early.startswith(b"HTTP/1.1 413 ")
        for chunk in _chunks(20 * MIB):  # a reset would raise here (ConnectionResetError / BrokenPipeError)
            s.sendall(chunk)
        rest = _recv_all(s)  # then a clean close (EOF), not a reset
    assert b'"body_too_large"' in early + rest


def test_server_memory_does_not_grow_with_the_body(server: RefServer) -> None:
    before = server.rss_kib()
    for _ in range(3):
        for headers in ({**JSON, "content-length": str(100 * MIB)}, JSON):
            r = httpx.post(
                f"{server.url}/v1/generate", content=_chunks(100 * MIB), headers=headers, timeout=60
            )
            assert r.status_code == 413
    assert server.rss_kib() - before < 32 * 1024  # KiB; holding one body would be 100 MiB


def test_a_body_under_the_limit_still_works_and_the_connection_is_reused(server: RefServer) -> None:
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/v1/generate", content=_chunks(3 * MIB), headers=JSON).status_code == 413
        r = c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 1})
        assert r.status_code == 200


# -- in process, at the exact limit -----------------------------------------------------------------------


def test_exactly_at_the_limit_is_read_one_more_byte_is_refused() -> None:
    body = b'{"prompt": "' + b"a" * 100 + b'", "max_new_tokens": 1}'
    with make_client(Config(limits=LimitsConfig(max_body_bytes=len(body)))) as c:
        wait_ready(c)
        assert c.post("/v1/generate", content=body, headers=JSON).status_code == 200
        r = c.post("/v1/generate", content=body + b" ", headers=JSON)
        assert r.status_code == 413
        assert f"limit of {len(body)} bytes" in r.json()["error"]["message"]

        def two_parts() -> Iterator[bytes]:  # chunked: no Content-Length to refuse on
            yield body
            yield b" "

        r = c.post("/v1/generate", content=two_parts(), headers=JSON)
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large"


def test_a_declared_huge_body_is_refused_on_unknown_routes_too() -> None:
    with make_client(Config(limits=LimitsConfig(max_body_bytes=1000))) as c:
        r = c.post("/v1/nope", content=b"x" * 2000, headers=JSON)
        assert r.status_code == 413 and r.json()["error"]["request_id"] == r.headers["x-request-id"]


# -- the middleware alone, as pure ASGI --------------------------------------------------------------------


class Wire:
    """A fake server side: feeds body messages, records what the middleware sends and how much was read."""

    def __init__(self, chunks: list[bytes], *, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.chunks = list(chunks)
        self.read = 0
        self.sent: list[Message] = []
        self.scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": headers or []}

    async def receive(self) -> Message:
        if not self.chunks:
            await asyncio.sleep(3600)  # a client that stops sending without closing
        chunk = self.chunks.pop(0)
        self.read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


def _app_reading_all(seen: list[int]):  # type: ignore[no-untyped-def]
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        total = 0
        while True:
            message = await receive()
            total += len(message.get("body", b""))
            seen.append(total)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def test_the_app_never_holds_more_than_the_limit_and_the_rest_is_drained() -> None:
    seen: list[int] = []
    wire = Wire([b"x" * 400] * 10)
    mw = BodyLimitMiddleware(_app_reading_all(seen), max_bytes=1000)
    asyncio.run(mw(wire.scope, wire.receive, wire.send))
    assert wire.status == 413
    assert max(seen) <= 1000  # the third chunk (crossing the limit) never reached the app
    assert wire.read == 4000  # the rest was drained, so the client is not reset
    assert wire.sent[1]["more_body"] is True and wire.sent[-1] == {
        "type": "http.response.body",
        "body": b"",
        "more_body": False,
    }


def test_the_drain_is_bounded_in_bytes_and_time() -> None:
    wire = Wire([b"x" * 1000] * 50, headers=[(b"content-length", b"50000")])
    mw = BodyLimitMiddleware(_app_reading_all([]), max_bytes=100, drain_bytes=5000)
    asyncio.run(mw(wire.scope, wire.receive, wire.send))
    assert wire.status == 413
    assert 5000 <= wire.read <= 7000  # stopped past the byte bound, long before 50000

    wire = Wire([b"x" * 10, b"y" * 10], headers=[(b"content-length", b"50000")])  # then silence
    mw = BodyLimitMiddleware(_app_reading_all([]), max_bytes=5, drain_s=0.2)
    asyncio.run(asyncio.wait_for(mw(wire.scope, wire.receive, wire.send), 5))
    assert wire.status == 413 and wire.sent[-1]["more_body"] is False


def test_expect_100_continue_is_not_waited_for() -> None:
    wire = Wire([b"x" * 100], headers=[(b"content-length", b"100000"), (b"expect", b"100-continue")])
    mw = BodyLimitMiddleware(_app_reading_all([]), max_bytes=10)
    asyncio.run(mw(wire.scope, wire.receive, wire.send))
    assert wire.status == 413 and wire.read == 0


def test_a_chunked_body_the_app_never_reads_is_not_counted(server: RefServer) -> None:
    """Counting happens as the app reads: a wrong method is still a 405 (uvicorn discards the unread body)."""
    r = httpx.post(
        f"{server.url}/healthz", content=_chunks(2 * MIB), headers={**JSON, "x-request-id": "big-1"}
    )
    assert r.status_code == 405 and r.headers["x-request-id"] == "big-1"


def test_the_refusal_is_logged_with_the_numbers(caplog: pytest.LogCaptureFixture) -> None:
    wire = Wire([b"x" * 1000] * 50, headers=[(b"content-length", b"50000")])
    mw = BodyLimitMiddleware(_app_reading_all([]), max_bytes=100, drain_bytes=5000)
    with caplog.at_level("INFO", logger="sluicegate.access"):
        asyncio.run(mw(wire.scope, wire.receive, wire.send))
    line = caplog.records[-1].getMessage()
    assert "body over 100 bytes refused" in line and "not to the end" in line
