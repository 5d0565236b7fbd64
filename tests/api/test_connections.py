"""Connection limits over raw sockets on the reference server (a subprocess, as `serve` runs it): header size
and count, header and body timeouts, idle connections, malformed HTTP and pipelining, Transfer-Encoding, and a
client that leaves mid-body. Short limits are configured; nothing asserts how fast an answer comes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.testing.refserver import RefServer, running
from sluicegate.testing.wait import wait_for
from tests.api.rawhttp import Reader, connect, exchange, request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    """Small head limits; time limits long enough that a slow test client never meets them."""
    with running(tmp_path_factory.mktemp("conn"), "--max-header-bytes", "8192", "--max-headers", "20",
                 "--log-level", "info") as s:
        yield s


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    """Short time limits, for the tests that wait for them (and only wait: no bound on how soon)."""
    with running(tmp_path_factory.mktemp("short"), "--header-timeout", "0.5", "--body-timeout", "0.5",
                 "--keepalive-timeout", "0.5", "--log-level", "info") as s:
        yield s


def assert_envelope(reply_status: int, err: dict[str, object], etype: str, request_id: str | None = None) -> None:
    assert err["type"] == etype, err
    assert isinstance(err["request_id"], str) and err["request_id"]
    if request_id is not None:
        assert err["request_id"] == request_id
    assert reply_status >= 400


def lines_with(server: RefServer, text: str) -> list[str]:
    return [line for line in server.log().splitlines() if text in line]


# -- header size and count -------------------------------------------------------------------------------


def test_headers_over_the_byte_limit_get_431_in_the_envelope(server: RefServer) -> None:
    data = request("GET", "/healthz", "X-Request-Id: big-head-1", "X-Filler: " + "a" * 9000)
    reply, closed = exchange(server.port, data)
    assert reply.status == 431
    assert_envelope(reply.status, reply.error, "headers_too_large", "big-head-1")
    assert reply.error["code"] == "header_bytes" and "8192 bytes" in reply.error["message"]
    assert reply.headers["x-request-id"] == "big-head-1"
    assert reply.headers["connection"] == "close" and closed


def test_one_header_streamed_without_end_is_cut_at_the_limit(server: RefServer) -> None:
    """A head that never ends is refused once it passes the limit; the server does not wait for its end."""
    with connect(server.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: ")
        for _ in range(10):
            s.sendall(b"b" * 1024)
        reply = Reader(s).reply()
    assert reply.status == 431 and reply.error["type"] == "headers_too_large"


def test_headers_just_under_the_limit_are_served(server: RefServer) -> None:
    reply, _ = exchange(server.port, request("GET", "/healthz", "X-Filler: " + "a" * 7000))
    assert reply.status == 200


def test_too_many_header_fields_get_431(server: RefServer) -> None:
    fields = [f"X-F{i}: 1" for i in range(25)]
    reply, closed = exchange(server.port, request("GET", "/healthz", *fields))
    assert reply.status == 431 and closed
    assert reply.error["code"] == "header_count" and "20 header fields" in reply.error["message"]


# -- time limits -----------------------------------------------------------------------------------------


def test_headers_that_do_not_arrive_in_time_get_408_then_close(short: RefServer) -> None:
    with connect(short.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Request-Id: slow-head-1\r\nHost: x\r\n")  # no blank line
        r = Reader(s)
        reply = r.reply()
        assert r.at_eof()
    assert reply.status == 408
    assert_envelope(reply.status, reply.error, "request_timeout", "slow-head-1")
    assert reply.error["code"] == "header_timeout"


def test_a_trickled_head_is_timed_from_its_first_byte(short: RefServer) -> None:
    """Slowloris: one byte at a time keeps no timer alive; the head's whole time is bounded."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 4000
    with connect(short.port) as s:
        s.settimeout(0.05)
        got = b""
        for byte in head:
            try:
                s.sendall(bytes([byte]))
                got += s.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if got:
                break
        s.settimeout(60)
        r = Reader(s)
        r.buf = got
        reply = r.reply()
    assert reply.status == 408 and reply.error["code"] == "header_timeout"


def test_a_body_that_stalls_gets_408_once_in_the_log(short: RefServer) -> None:
    with connect(short.port) as s:
        s.sendall(request("POST", "/v1/generate", "Content-Type: application/json", "X-Request-Id: stall-1",
                          "Content-Length: 100") + b'{"prompt": ')
        r = Reader(s)
        reply = r.reply()
        assert r.at_eof()
    assert reply.status == 408
    assert_envelope(reply.status, reply.error, "request_timeout", "stall-1")
    assert reply.error["code"] == "body_timeout"
    wait_for(lambda: lines_with(short, "stall-1"), 60,  # the access line is written when the app has seen the cut
             message="the access line")
    lines = lines_with(short, "stall-1")
    assert len(lines) == 1 and " 408 " in lines[0], lines
    assert "Traceback" not in short.log()


def test_a_new_connection_that_sends_nothing_is_closed_without_an_answer(short: RefServer) -> None:
    with connect(short.port) as s:
        assert Reader(s).at_eof()


def test_a_kept_alive_connection_closes_after_its_idle_time(short: RefServer) -> None:
    with connect(short.port) as s:
        s.sendall(request("GET", "/healthz"))
        r = Reader(s)
        reply = r.reply()
        assert reply.status == 200 and "connection" not in reply.headers  # kept alive
        assert r.at_eof()  # then nothing: closed, no answer


# -- malformed HTTP --------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    b"BLAH /x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET http://secret-host:99999999/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nsecret\r\n0\r\n\r\n",
])
def test_malformed_http_gets_400_in_the_envelope(server: RefServer, data: bytes) -> None:
    reply, closed = exchange(server.port, data)
    assert reply.status == 400 and closed
    assert_envelope(reply.status, reply.error, "malformed_http")
    assert reply.headers["x-request-id"] == reply.error["request_id"]
    assert reply.headers["content-type"] == "application/json"
    assert b"secret" not in reply.body  # the input is never echoed


def test_pipelined_garbage_keeps_the_valid_requests_before_it(server: RefServer) -> None:
    data = request("GET", "/healthz", "X-Request-Id: pipe-1") + request("GET", "/readyz", "X-Request-Id: pipe-2") \
        + b"\x00\x01 NOT HTTP\r\n\r\n"
    with connect(server.port) as s:
        s.sendall(data)
        r = Reader(s)
        first, second, third = r.reply(), r.reply(), r.reply()
        assert r.at_eof()
    assert (first.status, first.headers["x-request-id"]) == (200, "pipe-1")
    assert (second.status, second.headers["x-request-id"]) == (200, "pipe-2")
    assert third.status == 400 and third.error["type"] == "malformed_http"


def test_a_pipelined_request_with_a_broken_body_is_answered_after_the_one_before_it(server: RefServer) -> None:
    data = request("GET", "/healthz", "X-Request-Id: pipe-ok") + request(
        "POST", "/v1/generate", "Content-Type: application/json", "Transfer-Encoding: chunked",
        "X-Request-Id: pipe-bad") + b"zz\r\nnot a chunk\r\n"
    with connect(server.port) as s:
        s.sendall(data)
        r = Reader(s)
        first, second = r.reply(), r.reply()
        assert r.at_eof()
    assert (first.status, first.headers["x-request-id"]) == (200, "pipe-ok")
    assert second.status == 400 and second.error["type"] == "malformed_http"
    assert second.error["request_id"] == "pipe-bad"


@pytest.mark.parametrize("coding", ["gzip, chunked", "chunked, chunked", "identity", "deflate"])
def test_a_transfer_coding_other_than_chunked_gets_501(server: RefServer, coding: str) -> None:
    data = request("POST", "/v1/generate", "Content-Type: application/json", f"Transfer-Encoding: {coding}")
    reply, closed = exchange(server.port, data + b"0\r\n\r\n")
    assert reply.status in (400, 501) and closed  # llhttp itself refuses codings after chunked (400)
    if reply.status == 501:
        assert reply.error["type"] == "unsupported_transfer_encoding" and reply.error["param"] == "Transfer-Encoding"
    assert coding != "gzip, chunked" or reply.status == 501


def test_a_chunked_body_is_still_read(server: RefServer) -> None:
    body = b'{"prompt": "Hello", "max_new_tokens": 2}'
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    reply, _ = exchange(server.port, request("POST", "/v1/generate", "Content-Type: application/json",
                                             "Transfer-Encoding: chunked") + chunks)
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] >= 1


# -- a client that leaves mid-body -----------------------------------------------------------------------


def disconnects(server: RefServer) -> float:
    return parse_metrics(httpx.get(f"{server.url}/metrics").text).get(
        'sluicegate_client_disconnects_total{stage="body"}', 0.0)


def test_a_client_that_leaves_mid_body_is_a_disconnect_not_a_500(server: RefServer) -> None:
    before = disconnects(server)
    for i in range(3):
        with connect(server.port) as s:
            s.sendall(request("POST", "/v1/generate", "Content-Type: application/json", f"X-Request-Id: gone-{i}",
                              "Content-Length: 1000") + b'{"prompt": "abc')
    wait_for(lambda: disconnects(server) >= before + 3, 60, message="three disconnects")
    assert disconnects(server) == before + 3
    for i in range(3):
        lines = lines_with(server, f"gone-{i}")
        assert len(lines) == 1, lines
        assert " 499 " in lines[0] and "disconnected mid-body" in lines[0] and " INFO " in lines[0]
    log = server.log()
    assert "Traceback" not in log and "internal error" not in log


# -- open connections ------------------------------------------------------------------------------------


def test_connections_past_the_limit_are_kept_for_health_checks_then_closed(tmp_path: Path) -> None:
    with running(tmp_path, "--max-connections", "3", "--health-connections", "2", "--keepalive-timeout", "120") as srv:
        held = []
        for _ in range(3):  # the limit, each one served (so accepted) and then idle, kept alive
            s = connect(srv.port)
            s.sendall(request("GET", "/healthz"))
            assert Reader(s).reply().status == 200
            held.append(s)
        try:
            refused, closed = exchange(srv.port, request("GET", "/v1/models", "X-Request-Id: over-1"))
            assert refused.status == 503 and closed
            assert refused.error["type"] == "overloaded" and refused.error["code"] == "too_many_connections"
            assert refused.error["request_id"] == "over-1" and int(refused.headers["retry-after"]) >= 1
            for path in ("/healthz", "/readyz"):
                reply, closed = exchange(srv.port, request("GET", path))
                assert reply.status == 200 and closed  # answered, then closed: the headroom is freed again
            for _ in range(2):  # the headroom, held open with a health check in progress
                s = connect(srv.port)
                s.sendall(b"GET /healthz HTTP/1.1\r\n")
                held.append(s)
            with connect(srv.port) as s:  # past the limit and the headroom: closed at once, nothing said
                s.sendall(request("GET", "/healthz"))
                assert Reader(s).at_eof()
        finally:
            for s in held:
                s.close()
        # once they are gone, connections are served again
        wait_for(lambda: exchange(srv.port, request("GET", "/v1/models"))[0].status == 200, 60,
                 message="connections to be served again")


def push_header(port: int, total: int) -> int:
    """Send one header of `total` bytes (it never ends) until the server stops taking it; bytes sent."""
    sent = 0
    piece = b"h" * 65536
    with connect(port) as s:
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: ")
            while sent < total:
                s.sendall(piece)
                sent += len(piece)
        except OSError:  # answered 431 and closed under us: what a pusher gets
            pass
    return sent


def test_eight_connections_pushing_huge_headers_leave_memory_flat(server: RefServer) -> None:
    before = server.rss_kib()
    with ThreadPoolExecutor(8) as pool:
        pushes = [pool.submit(push_header, server.port, 32 << 20) for _ in range(8)]
        peak = before
        while not all(p.done() for p in pushes):
            peak = max(peak, server.rss_kib())
            time.sleep(0.01)
        sent = [p.result() for p in pushes]
    assert all(n < 32 << 20 for n in sent)  # each was cut off long before its 32 MiB
    assert peak - before < 32 << 10, f"RSS grew by {(peak - before) >> 10} MiB"


def test_a_client_that_leaves_a_stream_counts_as_an_answer_disconnect(tmp_path: Path) -> None:
    with running(tmp_path, "--step-delay-ms", "20", "--eos-slope", "0", "--log-level", "info") as srv:
        def answers() -> float:
            return parse_metrics(httpx.get(f"{srv.url}/metrics").text).get(
                'sluicegate_client_disconnects_total{stage="answer"}', 0.0)

        body = b'{"model": "reference", "prompt": "Hi", "max_tokens": 400, "stream": true, "logit_bias": {"257": -100}}'
        with connect(srv.port) as s:
            s.sendall(request("POST", "/v1/completions", "Content-Type: application/json", "X-Request-Id: left-1",
                              body=body))
            r = Reader(s)
            while b"data: " not in r.buf:
                assert r._more()
        wait_for(lambda: answers() >= 1, 60, message="the answer to be counted")
        assert answers() == 1
        lines = [line for line in srv.log().splitlines() if "left-1" in line]
        assert len(lines) == 1 and "client left before the answer ended" in lines[0], lines
        assert "Traceback" not in srv.log()
