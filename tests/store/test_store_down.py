"""Every route with the store failing, on a real Postgres database that refuses connections and then turns
read-only: no 500 anywhere, every refusal a 503 `store_unavailable` with Retry-After, and what needs no store
(generation with a key verified before the outage, the models, tokenising, health) answered as ever; the two
routes that store after the work (responses, predictions) deliver the answer they computed, saying it was not
stored."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from sluicegate.config import Config, JobsConfig, WebhookConfig
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import Served, auth, served
from tests.conftest import make_client
from tests.dbs import postgres_database, url_string
from tests.jobs.helpers import chat_line, jsonl, poll_seed
from tests.store_faults import read_only, refusing

CHAT = {"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/generate"): {"prompt": "hi", "max_new_tokens": 2},
    ("POST", "/v1/chat/completions"): CHAT,
    ("POST", "/v1/completions"): {"model": "reference", "prompt": "hi", "max_tokens": 2},
    ("POST", "/v1/messages"): {"model": "reference", "max_tokens": 2, "messages": CHAT["messages"]},
    ("POST", "/v1/messages/count_tokens"): {"model": "reference", "messages": CHAT["messages"]},
    ("POST", "/v1/responses"): {"model": "reference", "input": "hi", "max_output_tokens": 2},
    ("POST", "/v1/predictions"): {"input": {"prompt": "hi"}, "options": {"max_new_tokens": 2}},
    ("POST", "/v1/webhook-endpoints"): {"url": "http://192.0.2.1/hook", "event_types": ["batch.completed"]},
    ("POST", "/v1/batches"): None,  # filled with the file made before the outage
    ("POST", "/v1/batch-predictions"): [{"input": {"prompt": "x"}, "options": {"max_new_tokens": 1}}],
    ("POST", "/tokenize"): {"prompt": "hi"},
    ("POST", "/detokenize"): {"tokens": [104, 105]},
    ("POST", "/v1/admin/keys"): {"name": "during"},
    ("PATCH", "/v1/admin/keys/{key_id}"): {"name": "renamed"},
    ("POST", "/v1/batches/{batch_id}/cancel"): None,
}
# what must be answered through the outage: it needs no store
NEEDS_NO_STORE = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/playground", "/playground/assets/{name}",
                  "/docs/errors", "/v1/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages",
                  "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/v1/models", "/v1/models/{model_id}"}
STORED_AFTER_WORK = {"/v1/responses", "/v1/predictions"}  # POST: the answer comes back, marked not stored


def _routes() -> list[tuple[str, str]]:
    app = make_client().app
    out = [(m, c.path) for c in iter_route_contexts(app.routes) if c.path for m in sorted(c.methods or ())
           if m != "HEAD"]
    assert len(out) > 40
    return out


@pytest.fixture
def down() -> Iterator[tuple[Served, str, dict[str, str]]]:
    """A keyed server on its own Postgres database, objects of every kind made, the key verified once."""
    with postgres_database() as u:
        url = url_string(u)
        upgrade(url)
        config = Config(jobs=JobsConfig(poll_s=0.05), webhooks=WebhookConfig(allow_networks=("192.0.2.0/24",)))
        with served(url, config) as s:
            _k, secret = s.key(*Scope)
            with httpx.Client(base_url=s.url, headers=auth(secret), timeout=60) as c:
                ids = _objects(c)
            yield s, secret, ids
        s.admin.close()


def _objects(c: httpx.Client) -> dict[str, str]:
    f = c.post("/v1/files", files={"file": ("a.jsonl", io.BytesIO(jsonl([chat_line(1)])))}, data={"purpose": "batch"})
    b = c.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions",
                                    "completion_window": "24h"})
    job = c.post("/v1/batch-predictions", json=[{"input": {"prompt": "y"}, "options": {"max_new_tokens": 1}}])
    poll_seed(c, job.json()["id"])
    ids = {"file_id": f.json()["id"], "batch_id": b.json()["id"], "job_id": job.json()["id"],
           "response_id": c.post("/v1/responses", json=BODIES[("POST", "/v1/responses")]).json()["id"],
           "prediction_id": c.post("/v1/predictions", json=BODIES[("POST", "/v1/predictions")]).json()["id"],
           "endpoint_id": c.post("/v1/webhook-endpoints", json=BODIES[("POST", "/v1/webhook-endpoints")]).json()["id"],
           "key_id": c.post("/v1/admin/keys", json={"name": "target"}).json()["id"],
           "model_id": "reference", "name": "app.js"}
    assert all(ids.values()), ids
    return ids


def _call(c: httpx.Client, method: str, path: str, ids: dict[str, str]) -> httpx.Response:
    url = path.format(**ids)
    body = BODIES.get((method, path))
    if path == "/v1/files" and method == "POST":
        return c.post(url, files={"file": ("b.jsonl", io.BytesIO(jsonl([chat_line(2)])))}, data={"purpose": "batch"})
    if path == "/v1/batches" and method == "POST":
        body = {"input_file_id": ids["file_id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    if method in ("POST", "PATCH"):
        return c.request(method, url, json=body if body is not None else {})
    params = {"subject": ids["job_id"]} if path == "/v1/webhook-deliveries" else None
    return c.request(method, url, params=params)


def _judge(method: str, path: str, r: httpx.Response) -> None:
    what = f"{method} {path}: {r.status_code} {r.text[:300]}"
    assert r.status_code != 500 and r.status_code < 600, what
    if method == "POST" and path in STORED_AFTER_WORK:
        assert r.status_code == 200, what
        body = r.json()
        assert body.get("store") is False or any("not stored" in w for w in body.get("warnings", ())), what
        return
    if path in NEEDS_NO_STORE:
        assert r.status_code < 400, what
        return
    if r.status_code >= 400:
        assert r.status_code == 503 and r.headers.get("retry-after"), what
        assert r.json()["error"]["type"] == "store_unavailable", what


@pytest.mark.parametrize("fault", ["refusing", "read_only"])
def test_every_route_through_a_store_outage(fault: str, down: tuple[Served, str, dict[str, str]]) -> None:
    s, secret, ids = down
    routes = _routes()
    missing = [r for r in routes if r[0] in ("POST", "PATCH") and r not in BODIES and r[1] != "/v1/files"]
    assert not missing, f"a route this test does not know how to call: {missing}"
    with (refusing if fault == "refusing" else read_only)(s.admin.url), \
            httpx.Client(base_url=s.url, headers=auth(secret), timeout=60) as c:
        for method, path in routes:
            if method == "DELETE":
                continue  # below, after the reads: a delete that worked (none should) would hide the objects
            _judge(method, path, _call(c, method, path, ids))
        for method, path in routes:
            if method == "DELETE":
                _judge(method, path, _call(c, method, path, ids))
        keyed = c.post("/v1/generate", json=BODIES[("POST", "/v1/generate")], headers={"Idempotency-Key": "k-1"})
        _judge("POST", "/v1/predictions/{prediction_id}", keyed)  # its claim needs the store: a 503, or served
        if fault == "read_only":  # reads work: what only reads answers as ever
            assert c.get(f"/v1/predictions/{ids['prediction_id']}").status_code == 200
            usage = c.get("/v1/usage")  # the requests served meanwhile are not written yet, and it says so
            assert usage.status_code == 200 and usage.json()["unwritten_requests"] > 0, usage.text
    with httpx.Client(base_url=s.url, headers=auth(secret), timeout=60) as c:  # and after it, everything again
        assert c.get(f"/v1/predictions/{ids['prediction_id']}").status_code == 200
        assert c.post("/v1/predictions", json=BODIES[("POST", "/v1/predictions")]).json()["warnings"] == []


@pytest.mark.parametrize("stale_s", [300.0, 0.0])
def test_keys_verified_before_an_outage_keep_generating_through_it(stale_s: float) -> None:
    """A key this process verified within `--key-stale-seconds` is accepted while the store refuses connections
    (generation needs no store); one never seen is refused as the store's failure (fail closed), and so is
    every key with the window at 0. Once the store answers, a revocation made meanwhile is seen at once."""
    from sluicegate.config import AuthConfig
    from sluicegate.tenancy.keys import revoke_key
    from sluicegate.testing.wait import wait_for

    gen = BODIES[("POST", "/v1/generate")]
    with postgres_database() as u:
        url = url_string(u)
        upgrade(url)
        with served(url, Config(auth=AuthConfig(key_stale_s=stale_s))) as s:
            seen, seen_secret = s.key(Scope.GENERATE)
            _unseen, unseen_secret = s.key(Scope.GENERATE)
            assert httpx.post(f"{s.url}/v1/generate", json=gen, headers=auth(seen_secret), timeout=60).is_success
            keys = s.srv.state.tenancy.keys

            def generate() -> int:
                return httpx.post(f"{s.url}/v1/generate", json=gen, headers=auth(seen_secret), timeout=60).status_code

            with refusing(url):
                if stale_s:  # past the cache's TTL the store is asked, fails, and the verified answer stands
                    wait_for(lambda: generate() == 200 and keys.stale_answers > 0, message="a stale answer")
                    assert generate() == 200
                else:  # past the TTL nothing stands in for the store
                    wait_for(lambda: generate() == 503, message="the cached answer to run out")
                    assert generate() == 503
                r = httpx.post(f"{s.url}/v1/generate", json=gen, headers=auth(unseen_secret), timeout=60)
                assert r.status_code == 503 and r.json()["error"]["type"] == "store_unavailable"
                assert r.headers["retry-after"]
            revoke_key(s.admin, seen.id)
            wait_for(lambda: httpx.post(f"{s.url}/v1/generate", json=gen, headers=auth(seen_secret),
                                        timeout=60).status_code == 401, timeout=10, message="the revocation")
            s.admin.close()
