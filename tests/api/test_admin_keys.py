"""Keys over HTTP (`/v1/admin/keys`) with the admin scope, on SQLite and Postgres: create (the secret once, and it
works), list, read, change limits and scopes, revoke (refused within the cache's TTL); a key without the admin
scope gets 403; bad input is a 422 naming the field."""

from __future__ import annotations

import httpx

from sluicegate.tenancy.keys import Scope
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import GEN, auth, served

BASE = "/v1/admin/keys"


def test_the_key_lifecycle_over_http(db_url: str) -> None:
    with served(db_url) as s:
        _admin, admin = s.key(Scope.ADMIN, Scope.GENERATE, Scope.BATCH)  # it grants only the scopes it holds
        with httpx.Client(base_url=s.url, headers=auth(admin), timeout=30) as c:
            made = c.post(BASE, json={"name": "app", "scopes": ["generate"], "tpm": 60000, "rpm": 30,
                                      "max_concurrent": 2, "monthly_tokens": 1000000,
                                      "expires_at": "2099-01-01T00:00:00Z"})
            assert made.status_code == 201, made.text
            key = made.json()
            secret = key["secret"]
            assert secret.startswith("sg_live_") and key["state"] == "active" and key["rpm"] == 30
            assert key["expires_at"] == "2099-01-01T00:00:00Z" and key["burst"] is None
            assert httpx.post(f"{s.url}/v1/generate", json=GEN, headers=auth(secret), timeout=30).status_code == 200

            listed = c.get(BASE).json()["data"]
            assert [k["id"] for k in listed][-1] == key["id"]
            assert all(k["secret"] is None for k in listed) and secret not in c.get(BASE).text
            assert c.get(f"{BASE}/{key['id']}").json()["name"] == "app"

            changed = c.patch(f"{BASE}/{key['id']}", json={"rpm": None, "scopes": ["generate", "batch"],
                                                            "name": "app v2"}).json()
            assert changed["rpm"] is None and changed["scopes"] == ["batch", "generate"] and changed["tpm"] == 60000
            assert changed["name"] == "app v2"

            gone = c.delete(f"{BASE}/{key['id']}").json()
            assert gone["state"] == "revoked" and gone["revoked_at"]
            wait_for(lambda: httpx.post(f"{s.url}/v1/generate", json=GEN, headers=auth(secret),
                                          timeout=30).status_code == 401)
            assert c.get(f"{BASE}/key_000000000000000000000000").status_code == 404
            assert c.patch(f"{BASE}/{key['id']}", json={"rpm": 5}).status_code == 422  # revoked: no change


def test_a_key_without_the_admin_scope_gets_403(db_url: str) -> None:
    with served(db_url) as s:
        _k, gen = s.key(Scope.GENERATE, Scope.BATCH, Scope.METRICS)
        for method, path in (("POST", BASE), ("GET", BASE), ("PATCH", f"{BASE}/x"), ("DELETE", f"{BASE}/x")):
            r = httpx.request(method, s.url + path, headers=auth(gen), json={"name": "x"}, timeout=30)
            assert r.status_code == 403, (method, r.text)
            assert r.json()["error"]["code"] == "missing_scope" and "'admin'" in r.json()["error"]["message"]
        assert httpx.get(s.url + BASE, timeout=30).status_code == 401


def test_bad_input_is_refused_naming_the_field(db_url: str) -> None:
    with served(db_url) as s:
        _a, admin = s.key(*Scope)
        with httpx.Client(base_url=s.url, headers=auth(admin), timeout=30) as c:
            for body, param in (({"name": "x", "scopes": ["root"]}, "scopes[0]"), ({"name": "x", "tpm": 0}, "tpm"),
                                ({"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
                                ({"name": "x", "secret": "sg_live_x"}, "secret"), ({"scopes": ["admin"]}, "name"),
                                ({"name": "x", "expires_at": "2099-01-01T00:00:00"}, "expires_at")):
                r = c.post(BASE, json=body)
                assert r.status_code == 422, (body, r.text)
                assert r.json()["error"]["param"] == param, (body, r.json())
            made = c.post(BASE, json={"name": "y"}).json()
            assert made["scopes"] == ["generate"]
            r = c.patch(f"{BASE}/{made['id']}", json={"name": None})
            assert r.status_code == 422 and r.json()["error"]["param"] == "name"
            assert c.post(BASE, json={"name": "z", "expires_at": "2099-01-01t00:00:00.1234567z"}).status_code == 201
