"""Token-priced rate limits over a real socket (uvicorn on 127.0.0.1, in this process): on SQLite and Postgres
keys, with in-process buckets and with the machine's Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from sluicegate.config import Config, RateLimitConfig
from sluicegate.tenancy.keys import Scope, create_key
from tests.api.auth_helpers import GEN, Served, auth, served
from tests.ratelimit.conftest import REDIS_URL, need_redis

GEN_COST = 12 + 4  # "Hello there": BOS + 11 bytes on the reference vocabulary, plus max_new_tokens


@pytest.fixture(params=["in-process", "redis"])
def limits(request: pytest.FixtureRequest) -> Iterator[RateLimitConfig]:
    if request.param == "in-process":
        yield RateLimitConfig()
        return
    need_redis()
    prefix = f"sgtest:api:{uuid.uuid4().hex}:"
    yield RateLimitConfig(redis_url=REDIS_URL, key_prefix=prefix)
    with redis.Redis.from_url(REDIS_URL) as r:
        keys = list(r.scan_iter(match=prefix + "*"))
        if keys:
            r.delete(*keys)


def limited_key(s: Served, burst: int = 100, tpm: int = 1) -> str:
    """tpm 1: the bucket refills 1/60 token a second, so the numbers below do not move while a test runs."""
    return create_key(s.admin, "limited", {Scope.GENERATE}, tpm=tpm, burst=burst)[1]


def test_headers_on_every_response_and_429_when_empty(db_url: str, limits: RateLimitConfig) -> None:
    with served(db_url, Config(ratelimit=limits)) as s:
        secret = limited_key(s)
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret), timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-limit-tokens"] == "100"
        assert r.headers["x-ratelimit-remaining-tokens"] == str(100 - GEN_COST)  # at admission
        assert int(r.headers["x-ratelimit-reset"]) >= 1 and r.headers["x-ratelimit-reset-tokens"]
        used = r.json()["usage"]
        spent = used["prompt_tokens"] + used["completion_tokens"]  # settled to the real count
        bad = httpx.post(s.url + "/v1/generate", json={**GEN, "temperature": "hot"}, headers=auth(secret))
        assert bad.status_code == 422
        assert bad.headers["x-ratelimit-remaining-tokens"] == str(100 - spent)  # refused before: shown as is
        statuses = []
        for _ in range(10):
            r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret), timeout=30)
            statuses.append(r.status_code)
            if r.status_code == 429:
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
        err = r.json()["error"]
        assert err["type"] == "rate_limit_exceeded" and err["request_id"] == r.headers["x-request-id"]
        assert str(GEN_COST) in err["message"]
        assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) >= 1
        assert int(r.headers["x-ratelimit-remaining-tokens"]) < GEN_COST


def test_a_request_over_the_capacity_is_413_and_never_retried(db_url: str, limits: RateLimitConfig) -> None:
    with served(db_url, Config(ratelimit=limits)) as s:
        secret = limited_key(s, burst=50)
        r = httpx.post(s.url + "/v1/generate", json={**GEN, "max_new_tokens": 60}, headers=auth(secret))
        assert r.status_code == 413 and r.headers["x-should-retry"] == "false"
        assert r.json()["error"]["type"] == "request_exceeds_capacity"
        assert r.json()["error"]["param"] == "max_new_tokens"
        body = {"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
        r = httpx.post(s.url + "/v1/chat/completions", json=body, headers=auth(secret))
        assert r.status_code == 413 and r.json()["error"]["param"] == "max_tokens"
        body = {"model": "reference", "input": "hi", "max_output_tokens": 60}
        r = httpx.post(s.url + "/v1/responses", json=body, headers=auth(secret))
        assert r.status_code == 413 and r.json()["error"]["param"] == "max_output_tokens"
        r = httpx.post(s.url + "/v1/responses", json={**body, "max_output_tokens": 4}, headers=auth(secret),
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "50"
        ok = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret), timeout=30)
        assert ok.status_code == 200  # nothing was taken by the refusals


def test_a_stream_carries_the_headers_at_its_start_and_settles_at_its_end(db_url: str) -> None:
    with served(db_url) as s:
        secret = limited_key(s, burst=1000)
        body = {"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, headers=auth(secret)) as r:
            assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "1000"
            reserved_left = int(r.headers["x-ratelimit-remaining-tokens"])
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        usage = json.loads(lines[-1][6:])["usage"]
        actual = usage["prompt_tokens"] + usage["completion_tokens"]
        assert reserved_left == 1000 - (usage["prompt_tokens"] + 8)
        after = httpx.get(s.url + "/v1/models", headers=auth(secret))
        assert int(after.headers["x-ratelimit-remaining-tokens"]) == 1000 - actual  # unused tokens went back


def test_redis_down_fails_closed_with_503(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = RateLimitConfig(redis_url="redis://127.0.0.1:1/0", connect_timeout_s=0.05, op_timeout_s=0.2)
    with served(db_url, Config(ratelimit=dead)) as s:
        secret = limited_key(s)
        calls: list[str] = []
        limiter = s.srv.state.tenancy.limiter
        for name in ("reserve", "peek", "settle"):
            real = getattr(limiter, name)

            async def counted(*a: object, _real: Any = real, _name: str = name, **kw: object) -> Any:
                calls.append(_name)
                return await _real(*a, **kw)

            monkeypatch.setattr(limiter, name, counted)
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret), timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "rate_limiter_unavailable"
        assert "retry-after" in r.headers
        assert calls == ["reserve"]  # one bounded wait a refused request: no peek for the headers after it
    with served(db_url, Config(ratelimit=RateLimitConfig(redis_url=dead.redis_url, connect_timeout_s=0.05,
                                                         op_timeout_s=0.2, fail_open=True))) as s:
        secret = limited_key(s)
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(secret), timeout=30)
        assert r.status_code == 200 and "x-ratelimit-limit-tokens" not in r.headers  # admitted, unmetered


def test_keys_without_a_rate_are_unlimited_unless_the_server_sets_a_default(db_url: str) -> None:
    with served(db_url, Config(ratelimit=RateLimitConfig(default_tpm=6000))) as s:
        _, plain = s.key(Scope.GENERATE)
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(plain), timeout=30)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "6000"
    with served(db_url) as s:
        _, plain = s.key(Scope.GENERATE)
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers=auth(plain), timeout=30)
        assert r.status_code == 200 and "x-ratelimit-limit-tokens" not in r.headers
