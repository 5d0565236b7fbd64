"""API-key auth over a real socket (uvicorn on 127.0.0.1, in this process), on SQLite and on Postgres."""

from __future__ import annotations

import time

import httpx
import pytest

from sluicegate.engine import EngineRequest
from sluicegate.store.db import Store
from sluicegate.tenancy.keys import Scope, new_secret, revoke_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import GEN, auth, served, status


def test_open_while_the_store_holds_no_key_then_enforced(db_url: str) -> None:
    with served(db_url) as s:
        assert status(s.url, "/v1/generate", method="POST", json=GEN) == 200
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers={"Authorization": "Bearer sk-whatever"})
        assert r.status_code == 200  # clients that must send a header keep working
        assert status(s.url, "/metrics") == 200
        _, secret = s.key(Scope.GENERATE)
        start = time.monotonic()
        wait_for(lambda: status(s.url, "/v1/generate", method="POST", json=GEN) == 401)
        delay = time.monotonic() - start
        print(f"auth on {delay * 1e3:.0f} ms after the first key was created")
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret))
        assert r.status_code == 200 and "auth;dur=" in r.headers["server-timing"]
        assert status(s.url, "/healthz") == 200 and status(s.url, "/readyz") == 200


def test_every_refusal_is_a_401_envelope_that_names_no_key(db_url: str) -> None:
    with served(db_url) as s:
        good, secret = s.key(Scope.GENERATE)
        revoked, revoked_secret = s.key(Scope.GENERATE)
        revoke_key(s.admin, revoked.id)
        expired, expired_secret = s.key(Scope.GENERATE)
        s.expire(expired.id)
        bodies = {}
        for label, headers in {
            "missing": {},
            "unknown": auth(new_secret()),
            "revoked": auth(revoked_secret),
            "expired": auth(expired_secret),
            "malformed": auth("sk-not-ours"),
            "checksum": auth(secret[:-1] + ("0" if secret[-1] != "0" else "1")),
            "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
            "conflicting": {**auth(secret), "x-api-key": new_secret()},
        }.items():
            r = httpx.post(s.url + "/v1/generate", json=GEN, headers={**headers, "X-Request-Id": f"t-{label}"})
            assert r.status_code == 401, label
            assert r.headers["www-authenticate"].startswith("Bearer"), label
            err = r.json()["error"]
            assert err["request_id"] == r.headers["x-request-id"] == f"t-{label}"
            for value in headers.values():
                assert value.split()[-1] not in r.text, label
            bodies[label] = err
        assert bodies["missing"]["type"] == "authentication_required"
        assert {bodies[k]["type"] for k in bodies if k != "missing"} == {"invalid_api_key"}
        # unknown, revoked and expired cannot be told apart
        assert bodies["unknown"] == {**bodies["revoked"], "request_id": "t-unknown"}
        assert bodies["unknown"] == {**bodies["expired"], "request_id": "t-unknown"}
        assert bodies["unknown"]["code"] == "invalid_api_key"
        assert bodies["malformed"]["code"] == bodies["checksum"]["code"] == "malformed_api_key"
        assert bodies["basic"]["code"] == "unsupported_scheme"
        assert bodies["conflicting"]["code"] == "conflicting_api_keys"
        # both headers carry a key; the same key in both is fine
        assert status(s.url, "/v1/models", secret) == 200
        assert httpx.get(s.url + "/v1/models", headers={"x-api-key": secret}).status_code == 200
        assert httpx.get(s.url + "/v1/models", headers={**auth(secret), "x-api-key": secret}).status_code == 200
        assert good.usable()


def test_scopes_per_route(db_url: str) -> None:
    with served(db_url) as s:
        _, gen = s.key(Scope.GENERATE)
        _, batch = s.key(Scope.BATCH)
        _, metrics = s.key(Scope.METRICS)
        _, admin = s.key(Scope.ADMIN)
        chat = {"model": "reference", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        cases = [
            ("GET", "/healthz", None, None, 200),
            ("GET", "/readyz", None, None, 200),
            ("POST", "/v1/generate", gen, GEN, 200),
            ("POST", "/v1/generate", batch, GEN, 403),
            ("POST", "/v1/chat/completions", gen, chat, 200),
            ("POST", "/v1/chat/completions", metrics, chat, 403),
            ("POST", "/v1/completions", admin, {"model": "reference", "prompt": "Hi", "max_tokens": 2}, 403),
            ("POST", "/v1/predictions", batch, GEN, 403),
            ("GET", "/v1/batches", gen, None, 403),
            ("GET", "/v1/batches", batch, None, 200),
            ("GET", "/v1/files/file_1/content", batch, None, 404),  # let through; no such file
            ("GET", "/v1/files/file_1/content", gen, None, 403),
            ("GET", "/v1/batch-predictions", metrics, None, 403),
            ("GET", "/metrics", gen, None, 403),
            ("GET", "/metrics", metrics, None, 200),
            ("GET", "/metrics", None, None, 401),
            ("GET", "/v1/models", batch, None, 200),
            ("GET", "/v1/models/reference", metrics, None, 200),
            ("GET", "/v1/usage", batch, None, 200),
            ("GET", "/openapi.json", None, None, 401),
            ("GET", "/openapi.json", gen, None, 200),
            ("GET", "/healthz/x", None, None, 401),  # open means the exact path
            ("GET", "/", None, None, 200),  # the playground page and its assets: no data, so no key
            ("GET", "/playground", None, None, 200),
            ("GET", "/playground/assets/app.js", None, None, 200),
            ("GET", "/playground/assets/secret.txt", None, None, 404),  # only the files the page ships
            ("GET", "/playground/other", None, None, 401),  # the open tree is the assets' folder only
            ("GET", "/docs/errors", None, None, 200),  # the error catalog's page, where docs_url points
            ("GET", "/docs/errors/x", None, None, 401),
            ("GET", "/no/such/route", None, None, 401),
            ("GET", "/no/such/route", gen, None, 404),
        ]
        got = [(m, p, status(s.url, p, k, method=m, json=body)) for m, p, k, body, _ in cases]
        assert got == [(m, p, want) for m, p, _, _, want in cases]
        r = httpx.get(s.url + "/metrics", headers=auth(gen))
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("permission_denied", "missing_scope") and "'metrics'" in err["message"]
        assert 'error="insufficient_scope"' in r.headers["www-authenticate"]


def test_the_key_is_the_requests_tenant(db_url: str) -> None:
    with served(db_url) as s:
        key, secret = s.key(Scope.GENERATE)
        engine = s.srv.state.runtime.engine
        assert engine is not None
        seen: list[str] = []
        submit = engine.submit

        def recording(request: EngineRequest, sink: object) -> None:
            seen.append(request.tenant)
            submit(request, sink)  # type: ignore[arg-type]

        engine.submit = recording  # type: ignore[method-assign]
        assert status(s.url, "/v1/generate", secret, method="POST", json=GEN) == 200
        chat = {"model": "reference", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 2}
        assert status(s.url, "/v1/chat/completions", secret, method="POST", json=chat) == 200
        assert seen == [key.id] * 3


def test_a_revocation_reaches_another_server_on_the_same_database(db_url: str) -> None:
    """Two servers, each with its own engine and key cache; the key revoked through a third engine."""
    with served(db_url) as one, served(db_url) as two:
        key, secret = one.key(Scope.GENERATE)
        for s in (one, two):
            assert status(s.url, "/v1/models", secret) == 200  # cached as valid in both
        admin = Store.open(db_url)
        try:
            revoke_key(admin, key.id)
        finally:
            admin.close()
        start = time.monotonic()
        for s in (one, two):
            wait_for(lambda s=s: status(s.url, "/v1/models", secret) == 401)  # type: ignore[misc]
        print(f"revocation refused after {(time.monotonic() - start) * 1e3:.0f} ms")


def test_a_caller_without_a_key_is_refused_before_its_body_is_read(db_url: str) -> None:
    with served(db_url) as s:
        s.key(Scope.GENERATE)
        r = httpx.post(s.url + "/v1/generate", content=b"x" * (4 << 20), headers={"Content-Type": "application/json"})
        assert r.status_code == 401


def test_store_failure_is_a_503_never_a_pass(empty_db_url: str) -> None:
    from sqlalchemy import text

    from sluicegate.store.migrate import upgrade

    upgrade(empty_db_url)
    with served(empty_db_url) as s:
        _, secret = s.key(Scope.GENERATE)
        assert status(s.url, "/v1/models", secret) == 200
        with s.admin.engine.begin() as conn:
            conn.execute(text("DROP TABLE usage"))
            conn.execute(text("DROP TABLE api_keys"))
        r = httpx.get(s.url + "/v1/models", headers=auth(new_secret()))  # not cached: must ask the store
        assert r.status_code == 503 and r.json()["error"]["type"] == "store_unavailable"
        assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_key_never_reaches_the_log(db_url: str, header: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    with served(db_url) as s:
        _key, secret = s.key(Scope.GENERATE)
        revoked, revoked_secret = s.key(Scope.GENERATE)
        revoke_key(s.admin, revoked.id)
        secrets = [secret, revoked_secret, new_secret(), secret[:-2] + "xx"]
        for value in secrets:
            headers = {header: f"Bearer {value}" if header == "authorization" else value}
            httpx.post(s.url + "/v1/generate", json=GEN, headers=headers)
            httpx.get(s.url + "/metrics", headers=headers)
        httpx.get(s.url + "/v1/usage", headers=auth(secret))
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert sum(r.name == "sluicegate.access" for r in caplog.records) >= 9  # the log saw every request
    for value in secrets:
        assert value not in text and value[8:40] not in text
