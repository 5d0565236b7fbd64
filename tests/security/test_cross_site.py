"""A keyless server (the default) refuses writes a web page of another origin sent, multipart uploads included
(they need no CORS preflight): 403 `cross_site` by `Origin`, or by `Sec-Fetch-Site` where no `Origin` came,
on every write route; the server's own origin, clients that are no browser, and an origin `--cors-origin`
allows pass."""

from __future__ import annotations

import io

import httpx

from sluicegate.config import Config
from sluicegate.registry import ROUTES
from tests.api.threaded_server import threaded_server
from tests.jobs.helpers import chat_line, jsonl

EVIL = "https://evil.example"


def _upload(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/v1/files", files={"file": ("x.jsonl", io.BytesIO(jsonl([chat_line(1)])))},
                      data={"purpose": "batch"}, headers=headers, timeout=30)


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    err = r.json()["error"]  # Anthropic's routes say it in their shape (`permission_error`)
    assert err["code"] == ("permission_denied" if err["type"] == "permission_error" else "cross_site"), err
    assert "another origin" in err["message"] and err["param"] == "Origin", err
    assert "access-control-allow-origin" not in r.headers


def test_a_cross_site_upload_to_a_keyless_server_is_refused() -> None:
    with threaded_server() as srv:
        own = srv.url  # http://127.0.0.1:PORT
        for headers in ({"Origin": EVIL}, {"Origin": "null"}, {"Origin": "http://localhost:1"},
                        {"Origin": own.replace("127.0.0.1", "127.0.0.1.nip.io")},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Origin": own + "/path"}):
            _refused(_upload(own, headers))
        before = httpx.get(f"{own}/v1/files", timeout=30).json()["data"]
        assert before == []  # nothing was stored
        for headers in ({}, {"Origin": own}, {"Sec-Fetch-Site": "same-origin", "Origin": own},
                        {"Sec-Fetch-Site": "none"}):
            assert _upload(own, headers).status_code == 200


def test_every_write_route_refuses_another_origin() -> None:
    writes = [(m, r.path) for r in ROUTES for m in sorted(set(r.methods) & {"POST", "PATCH", "DELETE"})]
    assert len(writes) >= 15
    with threaded_server() as srv:
        for method, path in writes:
            path += "/x" if method != "POST" or path == "/v1/admin" else ""
            _refused(httpx.request(method, srv.url + path, json={}, headers={"Origin": EVIL}, timeout=30))
            plain = httpx.request(method, srv.url + path, json={}, timeout=30)  # no browser: judged as ever
            assert "another origin" not in plain.text, (method, path)


def test_an_origin_the_operator_allows_may_write() -> None:
    with threaded_server(Config(cors_origins=(EVIL,))) as srv:
        r = _upload(srv.url, {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == EVIL
        _refused(_upload(srv.url, {"Origin": "https://other.example"}))
    with threaded_server(Config(cors_origins=("*",))) as srv:
        assert _upload(srv.url, {"Origin": "https://other.example"}).status_code == 200
