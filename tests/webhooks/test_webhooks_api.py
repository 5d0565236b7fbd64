"""Webhooks over real sockets on SQLite and Postgres: endpoints per key, signed deliveries verified with the
Standard Webhooks verifier, retries after two 500s, 410 disables, redirects not followed, the delivery log,
the pinned address with the Host header kept, and SSRF refusals."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from sluicegate.config import Config, WebhookConfig
from sluicegate.tenancy.keys import KeyRecord, Scope
from sluicegate.testing.wait import wait_for
from sluicegate.webhooks import Guard
from tests.api.auth_helpers import Served, auth, served
from tests.webhooks.receiver import receiver

FAST = WebhookConfig(allow_networks=("127.0.0.0/8",), backoff_base_s=0.01, backoff_max_s=0.05, poll_s=0.05,
                     max_attempts=4, timeout_s=10)


@contextmanager
def server(db_url: str, cfg: WebhookConfig = FAST) -> Iterator[tuple[Served, KeyRecord, str]]:
    with served(db_url, Config(webhooks=cfg)) as s:
        key, secret = s.key(Scope.BATCH)
        yield s, key, secret


def register(s: Served, secret: str, url: str, types: list[str] | None = None) -> httpx.Response:
    return httpx.post(f"{s.url}/v1/webhook-endpoints", json={"url": url, "event_types": types or ["batch.completed"]},
                      headers=auth(secret), timeout=30)


def log_of(s: Served, secret: str, subject: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{s.url}/v1/webhook-deliveries", params={"subject": subject, "limit": 100}, headers=auth(secret),
                  timeout=30)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def settled(s: Served, secret: str, subject: str) -> dict[str, Any] | None:
    rows = log_of(s, secret, subject)
    return rows[0] if rows and rows[0]["status"] != "pending" else None


def test_signed_and_retried_after_two_500s(db_url: str) -> None:
    with receiver(500, 500, 204) as rx, server(db_url) as (s, key, secret):
        r = register(s, secret, rx.url + "/hooks?x=1", ["batch.completed", "batch.failed"])
        assert r.status_code == 201, r.text
        ep = r.json()
        assert ep["secret"].startswith("whsec_") and ep["status"] == "enabled"
        listed = httpx.get(f"{s.url}/v1/webhook-endpoints", headers=auth(secret), timeout=30).json()["data"]
        assert [e["id"] for e in listed] == [ep["id"]] and listed[0]["secret"] is None  # shown once
        data = {"id": "batch_1", "request_counts": {"total": 3}}
        assert s.srv.state.webhooks.enqueue(key.id, "batch.completed", data, subject="batch_1", event_id="evt_b1") == 1
        wait_for(lambda: settled(s, secret, "batch_1") is not None)
        assert rx.count() == 3
        hook = Webhook(ep["secret"])
        ids = set()
        for got in rx.got:
            event = hook.verify(got.body, got.headers)  # raises unless the signature is right
            assert event["type"] == "batch.completed" and event["data"] == data and event["object"] == "event"
            assert got.path == "/hooks?x=1" and got.headers["content-type"] == "application/json"
            ids.add(got.headers["webhook-id"])
        assert ids == {"evt_b1"}  # the same id on every retry
        with pytest.raises(Exception, match="signature"):
            Webhook("whsec_" + "A" * 43 + "=").verify(rx.got[0].body, rx.got[0].headers)
        row = settled(s, secret, "batch_1")
        assert row is not None and row["status"] == "delivered" and row["attempts"] == 3
        assert [a["status_code"] for a in row["log"]] == [500, 500, 204] and row["endpoint_id"] == ep["id"]
        by_ep = httpx.get(f"{s.url}/v1/webhook-endpoints/{ep['id']}/deliveries", headers=auth(secret), timeout=30)
        assert [d["id"] for d in by_ep.json()["data"]] == [row["id"]]
        # the same event again (a job system resuming) is not sent twice; other event types are filtered
        assert s.srv.state.webhooks.enqueue(key.id, "batch.completed", data, subject="batch_1", event_id="evt_b1") == 0
        assert s.srv.state.webhooks.enqueue(key.id, "batch.expired", data, subject="batch_1") == 0
        # another key sees nothing of it
        _, other = s.key(Scope.BATCH)
        assert log_of(s, other, "batch_1") == []
        r = httpx.get(f"{s.url}/v1/webhook-endpoints/{ep['id']}/deliveries", headers=auth(other), timeout=30)
        assert r.status_code == 404


def test_a_retry_goes_out_when_due_however_long_the_idle_poll(db_url: str) -> None:
    """The dispatcher backs off while idle (store/polling.py); a retry it scheduled itself is still looked for
    when it comes due, not at the next poll (here ten minutes away)."""
    with receiver(500, 204) as rx, server(
        db_url, dataclasses.replace(FAST, poll_s=600.0, backoff_base_s=1.0, backoff_max_s=1.0)
    ) as (s, key, secret):
        assert register(s, secret, rx.url + "/hooks").status_code == 201
        assert s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "batch_2"}, subject="batch_2") == 1
        wait_for(lambda: settled(s, secret, "batch_2") is not None)
        row = settled(s, secret, "batch_2")
        assert row is not None and row["status"] == "delivered"
        assert [a["status_code"] for a in row["log"]] == [500, 204]


def test_410_disables_the_endpoint(db_url: str) -> None:
    with receiver(410) as rx, server(db_url) as (s, key, secret):
        ep = register(s, secret, rx.url + "/gone").json()
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "batch_2"}, subject="batch_2")
        wait_for(lambda: settled(s, secret, "batch_2") is not None)
        row = settled(s, secret, "batch_2")
        assert row is not None and row["status"] == "failed" and row["attempts"] == 1 and rx.count() == 1
        listed = httpx.get(f"{s.url}/v1/webhook-endpoints", headers=auth(secret), timeout=30).json()["data"]
        assert listed[0]["id"] == ep["id"] and listed[0]["status"] == "disabled"
        assert "410" in listed[0]["disabled_reason"]
        assert s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "batch_3"}, subject="batch_3") == 0


def test_redirects_are_not_followed_and_attempts_run_out(db_url: str) -> None:
    with receiver(302, 503) as rx, server(db_url) as (s, key, secret):
        register(s, secret, rx.url + "/in")
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "batch_4"}, subject="batch_4")
        wait_for(lambda: settled(s, secret, "batch_4") is not None)
        row = settled(s, secret, "batch_4")
        assert row is not None and row["status"] == "failed" and row["attempts"] == FAST.max_attempts
        assert [a["status_code"] for a in row["log"]] == [302, 503, 503, 503]
        assert "redirects are not followed" in row["log"][0]["error"]
        assert {g.path for g in rx.got} == {"/in"}  # /elsewhere never asked for


def test_the_checked_address_is_used_and_the_host_header_kept(db_url: str) -> None:
    async def fake_dns(host: str, port: int) -> list[str]:
        assert host == "hooks.example.test"
        return ["127.0.0.1"]

    with receiver(200) as rx, server(db_url) as (s, key, secret):
        s.srv.state.webhooks.guard = Guard(FAST.allow_networks, fake_dns)
        port = rx.url.rsplit(":", 1)[1]
        assert register(s, secret, f"http://hooks.example.test:{port}/h").status_code == 201
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "b"}, subject="b")
        wait_for(lambda: rx.count() == 1)
        assert rx.got[0].headers["host"] == f"hooks.example.test:{port}"


def test_the_address_is_checked_again_at_every_attempt(db_url: str) -> None:
    """A name that resolved to an allowed address at registration and to another one later (DNS rebinding)
    is refused at the attempt: nothing is sent, and the log says why."""
    answers = {"hooks.example.test": "127.0.0.1"}

    async def fake_dns(host: str, port: int) -> list[str]:
        return [answers[host]]

    with receiver(200) as rx, server(db_url, dataclasses.replace(FAST, max_attempts=2)) as (s, key, secret):
        s.srv.state.webhooks.guard = Guard(FAST.allow_networks, fake_dns)
        port = rx.url.rsplit(":", 1)[1]
        assert register(s, secret, f"http://hooks.example.test:{port}/h").status_code == 201
        answers["hooks.example.test"] = "10.9.8.7"  # now private, and not allow-listed
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "b"}, subject="rebind")
        wait_for(lambda: settled(s, secret, "rebind") is not None)
        row = settled(s, secret, "rebind")
        assert row is not None and row["status"] == "failed" and rx.count() == 0
        assert all("non-public" in a["error"] and a["status_code"] is None for a in row["log"])


@pytest.mark.parametrize(("url", "code"), [
    ("http://127.0.0.1:9/x", "url_not_allowed"),
    ("http://10.1.2.3/", "url_not_allowed"),
    ("http://192.168.0.1/", "url_not_allowed"),
    ("http://169.254.169.254/latest/meta-data", "url_not_allowed"),
    ("http://[::1]/", "url_not_allowed"),
    ("http://[::ffff:127.0.0.1]/", "url_not_allowed"),
    ("http://[64:ff9b::a9fe:a9fe]/latest/meta-data", "url_not_allowed"),  # NAT64 of the metadata service
    ("http://[2002:7f00:1::1]/", "url_not_allowed"),  # 6to4 of 127.0.0.1
    ("http://0.0.0.0/", "url_not_allowed"),
    ("http://100.64.0.1/", "url_not_allowed"),
    ("ftp://93.184.216.34/", "invalid_url"),
    ("http://user:pw@93.184.216.34/", "invalid_url"),
    ("not a url", "invalid_url"),
])
def test_ssrf_refusals(db_url: str, url: str, code: str) -> None:
    with server(db_url, WebhookConfig()) as (s, _, secret):  # no allow-list
        r = register(s, secret, url)
        err = r.json()["error"]
        assert r.status_code == 422 and (err["param"], err["code"]) == ("url", code)
        assert url not in r.text


def test_delete_scope_limits_and_validation(db_url: str) -> None:
    with server(db_url, WebhookConfig(allow_networks=("127.0.0.1",), max_endpoints_per_key=2)) as (s, _, secret):
        _, other = s.key(Scope.BATCH)
        _, gen_only = s.key(Scope.GENERATE)
        assert register(s, gen_only, "http://127.0.0.1:9/").status_code == 403
        a = register(s, secret, "http://127.0.0.1:9/a").json()
        register(s, secret, "http://127.0.0.1:9/b")
        r = register(s, secret, "http://127.0.0.1:9/c")
        assert r.status_code == 422 and r.json()["error"]["code"] == "too_many_endpoints" and "2" in r.text
        for body, param in (({"url": "http://127.0.0.1:9/", "event_types": ["batch.done"]}, "event_types[0]"),
                            ({"url": "http://127.0.0.1:9/", "event_types": []}, "event_types"),
                            ({"url": "http://127.0.0.1:9/"}, "event_types")):
            r = httpx.post(f"{s.url}/v1/webhook-endpoints", json=body, headers=auth(secret), timeout=30)
            assert r.status_code == 422 and r.json()["error"]["param"] == param
        gone = f"{s.url}/v1/webhook-endpoints/{a['id']}"
        assert httpx.delete(gone, headers=auth(other), timeout=30).status_code == 404
        r = httpx.delete(gone, headers=auth(secret), timeout=30)
        assert r.status_code == 200 and r.json() == {"id": a["id"], "object": "webhook_endpoint", "deleted": True}
        assert httpx.delete(gone, headers=auth(secret), timeout=30).status_code == 404
        listed = httpx.get(f"{s.url}/v1/webhook-endpoints", headers=auth(secret), timeout=30).json()["data"]
        assert len(listed) == 1 and "secret" in json.dumps(listed) and listed[0]["secret"] is None


def test_two_replicas_send_each_attempt_once(db_url: str) -> None:
    """Two servers on one database both run a dispatcher; every event reaches the receiver exactly once."""
    with receiver(200) as rx, server(db_url) as (s, key, secret), served(db_url, Config(webhooks=FAST)) as s2:
        register(s, secret, rx.url + "/both")
        events = [f"evt_r{i}" for i in range(20)]
        for i, ev in enumerate(events):  # half queued through each replica
            (s if i % 2 else s2).srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": ev}, subject="two",
                                                            event_id=ev)
        wait_for(lambda: sum(d["status"] == "delivered" for d in log_of(s, secret, "two")) == len(events))
        assert sorted(g.headers["webhook-id"] for g in rx.got) == sorted(events)
