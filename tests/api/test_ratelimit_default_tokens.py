"""Requests that set no new-token limit, on a limited key, over a real socket (SQLite and Postgres keys,
in-process buckets and the machine's Redis): however many arrive at once, together they never take more than
the key's capacity (plus the refill), because each reserves to the end of the context window."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from sluicegate.config import Config, RateLimitConfig
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth, served
from tests.api.test_ratelimit_api import limits  # noqa: F401 (the fixture: in-process and Redis)
from tests.api.threaded_server import SlowRunner

N_CTX = 512
BURST = 1200  # room for two window-long requests, not three; but for three "prompt + 256" estimates


def to_the_window() -> SlowRunner:
    return SlowRunner(n_ctx=N_CTX, n_slots=4, eos_slope=0.0, delay_s=0.002)  # no EOS: each runs to the window


def test_concurrent_requests_without_max_tokens_stay_within_the_capacity(
    db_url: str, limits: RateLimitConfig,  # noqa: F811
) -> None:
    with served(db_url, Config(ratelimit=limits), runner=to_the_window) as s:
        _, secret = create_key(s.admin, "limited", {Scope.GENERATE}, tpm=1, burst=BURST)  # tpm 1: no refill
        body = {"model": "reference", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}

        def one(_: int) -> httpx.Response:
            return httpx.post(s.url + "/v1/chat/completions", json=body, headers=auth(secret), timeout=120)

        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(one, range(3)))
        done = [r for r in replies if r.status_code == 200]
        assert done and all(r.status_code in (200, 429) for r in replies), [r.text for r in replies]
        assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in done)  # they ran to the window
        spent = sum(r.json()["usage"]["total_tokens"] for r in done)
        assert spent <= BURST + 1, f"{len(done)} requests took {spent} tokens of a {BURST}-token capacity"
        refused = [r for r in replies if r.status_code == 429]
        assert all("may cost" in json.dumps(r.json()) for r in refused)

        def ledger() -> int:
            rows = httpx.get(s.url + "/v1/usage", headers=auth(secret), timeout=30).json()["data"]
            return sum(d["requests"] for d in rows)

        wait_for(lambda: ledger() == 3)
