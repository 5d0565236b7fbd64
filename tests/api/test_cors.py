"""`--cors-origin`: a page on an allowed origin may call the API (preflight without a key, errors readable), any
other origin gets no CORS headers, and a refused preflight is the envelope."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from sluicegate.config import Config
from tests.conftest import make_client, wait_ready

APP = "https://app.example.com"


@pytest.fixture(scope="module")
def cors() -> Iterator[TestClient]:
    with make_client(Config(cors_origins=(APP,))) as c:
        wait_ready(c)
        yield c


def test_a_preflight_from_an_allowed_origin_passes_without_a_key(cors: TestClient) -> None:
    r = cors.options("/v1/chat/completions", headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-retry-count"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == APP
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "x-stainless-retry-count" in r.headers["access-control-allow-headers"]
    assert "access-control-allow-credentials" not in r.headers


def test_answers_and_errors_carry_the_origin_and_expose_the_headers_a_client_reads(cors: TestClient) -> None:
    ok = cors.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2}, headers={"Origin": APP})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP
    exposed = ok.headers["access-control-expose-headers"].lower()
    assert "x-request-id" in exposed and "x-ratelimit-remaining-tokens" in exposed and "retry-after" in exposed
    bad = cors.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 0}, headers={"Origin": APP})
    assert bad.status_code == 422 and bad.headers["access-control-allow-origin"] == APP


def test_another_origin_gets_no_cors_headers_and_a_refused_preflight_is_the_envelope(cors: TestClient) -> None:
    evil = "https://evil.example"
    r = cors.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2}, headers={"Origin": evil})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site"  # a write from it is refused
    assert "access-control-allow-origin" not in r.headers
    pre = cors.options("/v1/generate", headers={"Origin": evil, "Access-Control-Request-Method": "PUT"})
    assert pre.status_code == 400
    err = pre.json()["error"]
    assert err["type"] == "cors_refused" and "origin, method" in err["message"]
    assert err["request_id"] == pre.headers["x-request-id"]


def test_without_the_option_no_origin_is_allowed() -> None:
    with make_client() as c:
        wait_ready(c)
        r = c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2}, headers={"Origin": APP})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert r.json()["error"]["code"] == "cross_site"
        # the server's own origin (the playground page) writes as any client does
        own = c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2},
                     headers={"Origin": "http://127.0.0.1"})
        assert own.status_code == 200 and "access-control-allow-origin" not in own.headers
