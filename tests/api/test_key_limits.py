"""A key's limits beside its tokens, over a real socket on SQLite and Postgres: requests per minute (with
OpenAI's -Requests headers), requests in flight, and a monthly token budget, each refused in the envelope."""

from __future__ import annotations

import threading

import httpx

from sluicegate.store.db import Store
from sluicegate.tenancy.keys import Scope, create_key
from tests.api.auth_helpers import GEN, auth, served
from tests.api.threaded_server import SlowRunner


def make_key(s_admin: Store, **limits: int) -> str:
    _rec, secret = create_key(s_admin, "limited", {Scope.GENERATE}, **limits)
    return secret


def test_requests_per_minute_beside_the_tokens(db_url: str) -> None:
    with served(db_url) as s:
        secret = make_key(s.admin, rpm=2, tpm=100000)
        with httpx.Client(base_url=s.url, headers=auth(secret), timeout=30) as c:
            first = c.post("/v1/generate", json=GEN)
            assert first.status_code == 200
            assert first.headers["x-ratelimit-limit-requests"] == "2"
            assert first.headers["x-ratelimit-remaining-requests"] == "1"
            assert first.headers["x-ratelimit-reset-requests"].endswith("s")
            assert first.headers["x-ratelimit-limit-tokens"] == "100000"  # both, never one instead of the other
            assert c.post("/v1/generate", json=GEN).status_code == 200
            third = c.post("/v1/generate", json=GEN)
            assert third.status_code == 429
            err = third.json()["error"]
            assert err["type"] == "rate_limit_exceeded" and err["code"] == "requests"
            assert "2 requests a minute" in err["message"]
            assert int(third.headers["retry-after"]) >= 1 and int(third.headers["retry-after-ms"]) >= 1
            assert third.headers["x-ratelimit-remaining-requests"] == "0"
            assert c.get("/v1/models").status_code == 200  # reading counts for nothing


def test_requests_in_flight(db_url: str) -> None:
    with served(db_url, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.05, eos_slope=0.0)) as s:
        secret = make_key(s.admin, max_concurrent=1)
        started = threading.Event()
        done: list[int] = []

        def long_stream() -> None:
            body = {"model": "reference", "prompt": "Hello there", "max_tokens": 40, "stream": True}
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, headers=auth(secret), timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()
                done.append(r.status_code)

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(60)
        second = httpx.post(f"{s.url}/v1/generate", json=GEN, headers=auth(secret), timeout=30)
        t.join(60)
        assert second.status_code == 429, second.text
        err = second.json()["error"]
        assert err["code"] == "concurrent_requests" and second.headers["retry-after"] == "1"
        assert done == [200]
        # the slot came back when the stream ended
        assert httpx.post(f"{s.url}/v1/generate", json=GEN, headers=auth(secret), timeout=30).status_code == 200


def test_a_monthly_budget_refuses_what_it_cannot_hold(db_url: str) -> None:
    with served(db_url) as s:
        secret = make_key(s.admin, monthly_tokens=60)
        with httpx.Client(base_url=s.url, headers=auth(secret), timeout=30) as c:
            ok = c.post("/v1/generate", json={**GEN, "max_new_tokens": 10})
            assert ok.status_code == 200
            big = c.post("/v1/generate", json={**GEN, "max_new_tokens": 100})
            assert big.status_code == 429
            err = big.json()["error"]
            assert err["type"] == "budget_exceeded" and err["code"] == "monthly_tokens"
            assert big.headers["x-should-retry"] == "false" and int(big.headers["retry-after"]) > 0
            assert "renews at" in err["message"]
