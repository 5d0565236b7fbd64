"""Anthropic's routes under every boundary rule of the others, over a real socket on SQLite and Postgres: keys
(`x-api-key` or Bearer) and scopes, the usage ledger, token-priced limits, Idempotency-Key (streams included),
each refusal in Anthropic's shape."""

from __future__ import annotations

from typing import Any

import httpx

from sluicegate.config import Config, RateLimitConfig
from sluicegate.tenancy.keys import Scope, create_key
from tests.api.auth_helpers import Served, served

URL = "/v1/messages"
BODY = {"model": "reference", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Hello"}]}


def post(s: Served, path: str = URL, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    return httpx.post(s.url + path, json=BODY if body is None else body, headers=headers, timeout=60)


def kind(r: httpx.Response) -> tuple[int, str]:
    body = r.json()
    assert body["type"] == "error" and body["request_id"] == r.headers["request-id"], body
    return r.status_code, body["error"]["type"]


def test_keys_scopes_and_the_ledger(db_url: str) -> None:
    with served(db_url) as s:
        gen_key, gen = s.key(Scope.GENERATE)
        _, batch = s.key(Scope.BATCH)
        assert kind(post(s)) == (401, "authentication_error")
        assert kind(post(s, **{"x-api-key": "sk-not-a-key"})) == (401, "authentication_error")
        assert kind(post(s, **{"x-api-key": batch})) == (403, "permission_error")
        assert kind(post(s, URL + "/count_tokens", {"model": "reference", "messages": BODY["messages"]},
                         **{"x-api-key": batch})) == (403, "permission_error")
        ok = post(s, **{"x-api-key": gen, "anthropic-version": "2023-06-01"})
        assert ok.status_code == 200, ok.text
        assert post(s, authorization=f"Bearer {gen}").status_code == 200
        counted = post(s, URL + "/count_tokens", {"model": "reference", "messages": BODY["messages"]},
                       **{"x-api-key": gen})
        assert counted.status_code == 200
        (day,) = httpx.get(s.url + "/v1/usage", headers={"x-api-key": gen}, timeout=30).json()["data"]
        # metered: the two messages (6 tokens each), not the count
        assert (day["key_id"], day["requests"], day["generated_tokens"]) == (gen_key.id, 2, 12)


def test_token_priced_limits(db_url: str) -> None:
    with served(db_url, Config(ratelimit=RateLimitConfig())) as s:
        secret = create_key(s.admin, "limited", {Scope.GENERATE}, tpm=1, burst=60)[1]
        first = post(s, **{"x-api-key": secret})
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-tokens"] == "60"
        statuses = [first.status_code]
        r = first
        for _ in range(10):
            r = post(s, **{"x-api-key": secret})
            statuses.append(r.status_code)
            if r.status_code == 429:
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
        assert kind(r) == (429, "rate_limit_error") and int(r.headers["retry-after"]) >= 1
        huge = post(s, body={**BODY, "max_tokens": 500}, **{"x-api-key": secret})
        assert kind(huge) == (413, "request_too_large")


def test_idempotency_whole_and_streamed(db_url: str) -> None:
    with served(db_url) as s:
        engine = s.srv.state.runtime.engine
        assert engine is not None
        first = post(s, **{"Idempotency-Key": "m-1"})
        again = post(s, **{"Idempotency-Key": "m-1"})
        assert first.status_code == again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content and engine.stats.requests_finished == 1
        streamed = {**BODY, "stream": True}
        one = post(s, body=streamed, **{"Idempotency-Key": "m-2"})
        two = post(s, body=streamed, **{"Idempotency-Key": "m-2"})
        assert one.status_code == 200 and two.headers["idempotent-replayed"] == "true"
        assert two.content == one.content and one.content.endswith(b"event: message_stop\ndata: {\"type\": "
                                                                   b"\"message_stop\"}\n\n")
        assert engine.stats.requests_finished == 2
        reused = post(s, body={**BODY, "max_tokens": 5}, **{"Idempotency-Key": "m-1"})
        assert kind(reused) == (400, "invalid_request_error")
        assert reused.json()["error"]["code"] == "idempotency_key_reused"
