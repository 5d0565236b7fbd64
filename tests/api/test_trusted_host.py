"""Trusted hosts over a real socket: raw requests with the Host header a DNS-rebinding page would send."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from sluicegate.api.middleware.trusted_host import HostRule, host_name, parse_pattern
from sluicegate.config import Config
from tests.api.threaded_server import Threaded, threaded_server
from tests.unit.test_cli import config, parse


def raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as is; read the whole answer (the request asks the server to close)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def get(url: str, host: bytes | None, path: str = "/healthz") -> tuple[int, dict[str, str], bytes]:
    host_line = b"" if host is None else b"Host: " + host + b"\r\n"
    return raw(url, f"GET {path} HTTP/1.1\r\n".encode() + host_line + b"Connection: close\r\n\r\n")


@pytest.fixture(scope="module")
def loopback() -> Iterator[Threaded]:
    with threaded_server(Config(host="127.0.0.1")) as srv:
        yield srv


def test_a_foreign_host_gets_the_envelope_with_the_request_id(loopback: Threaded) -> None:
    for host in (b"evil.example", b"evil.example:8000", b"127.0.0.1.evil.example", b"localhost.evil.example",
                 b"[::2]:80", b"0.0.0.0", b"localhost:8000:1", b"loc\xc3\xa4lhost"):
        status, headers, body = get(loopback.url, host)
        assert status == 400, host
        error = json.loads(body)["error"]
        assert error["type"] == error["code"] == "untrusted_host" and error["param"] == "Host"
        assert error["request_id"] == headers["x-request-id"]
        assert headers["content-type"] == "application/json"
        assert b"evil" not in body and b"::2" not in body  # the header is never echoed


def test_loopback_names_are_served_with_any_port(loopback: Threaded) -> None:
    port = urlsplit(loopback.url).port
    for host in (b"localhost", b"LOCALHOST", b"localhost.", b"127.0.0.1", f"127.0.0.1:{port}".encode(),
                 b"[::1]", b"[::1]:8000", f"localhost:{port}".encode()):
        assert get(loopback.url, host)[0] == 200, host


def test_a_request_without_a_host_is_refused(loopback: Threaded) -> None:
    status, _, body = raw(loopback.url, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status == 400 and json.loads(body)["error"]["type"] == "untrusted_host"


def test_a_refused_request_reaches_no_route_and_no_engine(loopback: Threaded) -> None:
    before = loopback.runner.execute_calls
    body = b'{"prompt": "Hello", "max_new_tokens": 4}'
    status, _, answer = raw(loopback.url, b"POST /v1/generate HTTP/1.1\r\nHost: evil.example\r\n"
                            b"Content-Type: application/json\r\nConnection: close\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert status == 400 and json.loads(answer)["error"]["type"] == "untrusted_host"
    assert loopback.runner.execute_calls == before
    status, _, answer = raw(loopback.url, b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Content-Type: application/json\r\nConnection: close\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] >= 1


def test_a_wildcard_bind_serves_any_host() -> None:
    with threaded_server(Config(host="0.0.0.0")) as srv:  # the rule reads the configured bind
        assert get(srv.url, b"evil.example")[0] == 200
        assert get(srv.url, b"anything.example:1234", "/readyz")[0] == 200


def test_a_configured_list_replaces_the_default() -> None:
    # 127.0.0.1 stays listed: the test server's readiness poll uses it
    config = Config(host="127.0.0.1", allowed_hosts=("api.example.com", "*.internal", "127.0.0.1"))
    with threaded_server(config) as srv:
        for host in (b"api.example.com", b"API.example.com:443", b"gpu1.internal", b"a.b.internal:80", b"127.0.0.1"):
            assert get(srv.url, host)[0] == 200, host
        for host in (b"localhost", b"[::1]", b"internal", b"example.com", b"evil.example"):
            status, _, body = get(srv.url, host)
            assert status == 400 and b"--allowed-hosts" in body, host


def test_host_parsing() -> None:
    assert host_name(b"Example.COM.:80") == "example.com"
    assert host_name(b"[0:0:0:0:0:0:0:1]:8000") == "::1"
    assert host_name(b"127.0.0.1") == "127.0.0.1"
    for bad in (b"", b":80", b"a:b", b"[::1", b"[::1]x", b"[nope]", b"a b", b"-a.com", b"a..b", b"\xff"):
        assert host_name(bad) is None, bad


def test_rules_by_bind() -> None:
    assert HostRule.for_bind("127.0.0.1", None).accepts("localhost")
    assert HostRule.for_bind("127.0.0.2", None).accepts("127.0.0.2")
    assert not HostRule.for_bind("::1", None).accepts("evil.example")
    assert not HostRule.for_bind("localhost", None).accepts(None)
    for bind in ("0.0.0.0", "::", "", "192.0.2.7"):
        assert HostRule.for_bind(bind, None).accepts("evil.example"), bind
    assert HostRule.for_bind("0.0.0.0", ["*"]).allowed is None
    assert not HostRule.for_bind("0.0.0.0", ["api.example.com"]).accepts("evil.example")


def test_the_allowed_hosts_flag() -> None:
    assert config().allowed_hosts is None
    got = config("--allowed-hosts", "a.example, *.internal", "--allowed-hosts", "[::1],10.0.0.1").allowed_hosts
    assert got == ("a.example", "*.internal", "::1", "10.0.0.1")
    for bad in ("", "a b", "*.", "http://a.example", "a.example:80"):
        with pytest.raises(SystemExit):
            parse("--allowed-hosts", bad)
    assert parse_pattern("*") == "*"
