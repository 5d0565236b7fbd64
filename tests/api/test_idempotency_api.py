"""Idempotency-Key over a real socket (uvicorn on 127.0.0.1, in this process), on SQLite and Postgres: stored
answers replayed byte for byte (streams included), another request under a used key, refusals that are not
stored, the key's format, and keys scoped to the API key."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from sluicegate.config import Config, IdempotencyConfig
from sluicegate.store.models import IdempotencyRecord
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import GEN, Served, auth, served, status

CHAT = {"model": "reference", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
        "temperature": 0}
COMPLETION = {"model": "reference", "prompt": "Hello there", "max_tokens": 6, "temperature": 0}
BODIES = {"/v1/generate": GEN, "/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}


def finished(s: Served) -> int:
    engine = s.srv.state.runtime.engine
    assert engine is not None
    return engine.stats.requests_finished


def post(s: Served, path: str, body: dict[str, Any] | str, key: str | None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    if isinstance(body, str):
        return httpx.post(s.url + path, content=body, headers={**headers, "content-type": "application/json"},
                          timeout=60)
    return httpx.post(s.url + path, json=body, headers=headers, timeout=60)


def rows(s: Served) -> list[IdempotencyRecord]:
    with s.admin.session() as session:
        return list(session.execute(select(IdempotencyRecord)).scalars())


@pytest.mark.parametrize("path", list(BODIES))
def test_a_whole_answer_is_stored_and_replayed(db_url: str, path: str) -> None:
    with served(db_url) as s:
        body = BODIES[path]
        first = post(s, path, body, "order-1")
        assert first.status_code == 200, first.text
        assert "idempotent-replayed" not in first.headers
        # the same request written otherwise: another key order, whitespace, an explicit default
        spelled = {"temperature": 0, **{k: v for k, v in reversed(body.items()) if k != "temperature"}}
        spelled["top_p"] = 1.0
        again = post(s, path, json.dumps(spelled, indent=3), "order-1")
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content  # byte for byte: the same id, text and usage
        assert again.headers["content-type"] == first.headers["content-type"]
        assert again.headers["x-request-id"] != first.headers["x-request-id"]  # a request of its own
        assert finished(s) == 1  # the engine generated once
        assert post(s, path, body, '"order-1"').content == first.content  # the draft's sf-string form: same key
        fresh = post(s, path, body, "order-2")
        assert fresh.status_code == 200 and "idempotent-replayed" not in fresh.headers and finished(s) == 2
        (row, _) = sorted(rows(s), key=lambda r: r.key)
        assert (row.scope, row.key, row.route, row.status) == ("", "order-1", path, 200)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_is_stored_and_replayed_event_for_event(db_url: str, path: str) -> None:
    body = {**BODIES[path], "stream": True, "stream_options": {"include_usage": True}}
    with served(db_url) as s:
        with httpx.stream("POST", s.url + path, json=body, headers={"Idempotency-Key": "s-1"}, timeout=60) as r:
            assert r.status_code == 200 and "idempotent-replayed" not in r.headers
            first = r.read()
        with httpx.stream("POST", s.url + path, json=body, headers={"Idempotency-Key": "s-1"}, timeout=60) as r:
            assert r.status_code == 200 and r.headers["idempotent-replayed"] == "true"
            assert r.headers["content-type"].startswith("text/event-stream")
            replayed = r.read()
        assert replayed == first and first.endswith(b"data: [DONE]\n\n")
        events = [json.loads(line[6:]) for line in replayed.decode().splitlines() if line.startswith("data: {")]
        assert events[-1]["usage"]["completion_tokens"] == 6
        assert finished(s) == 1
        plain = post(s, path, {**BODIES[path]}, "s-1")  # not streamed: another request
        assert plain.status_code == 400 and plain.json()["error"]["code"] == "idempotency_key_reused"


def test_the_same_key_with_another_request_is_refused(db_url: str) -> None:
    with served(db_url) as s:
        assert post(s, "/v1/generate", GEN, "k").status_code == 200
        other = post(s, "/v1/generate", {**GEN, "max_new_tokens": 5}, "k")
        assert other.status_code == 422
        err = other.json()["error"]
        assert err["type"] == "idempotency_key_reused" and err["param"] == "Idempotency-Key"
        assert err["request_id"] == other.headers["x-request-id"]
        # another route under the same key, with OpenAI's mapping: 400 invalid_request_error, our kind in `code`
        elsewhere = post(s, "/v1/completions", COMPLETION, "k")
        assert elsewhere.status_code == 400
        assert elsewhere.json()["error"]["type"] == "invalid_request_error"
        assert elsewhere.json()["error"]["code"] == "idempotency_key_reused"
        assert post(s, "/v1/chat/completions", CHAT, "c").status_code == 200
        changed = post(s, "/v1/chat/completions", {**CHAT, "temperature": 0.5}, "c")
        assert changed.status_code == 400 and changed.json()["error"]["code"] == "idempotency_key_reused"
        assert finished(s) == 2


def test_refusals_before_execution_are_not_stored(db_url: str) -> None:
    with served(db_url) as s:
        bad = post(s, "/v1/generate", {**GEN, "temperature": "hot"}, "v")  # refused by validation: never claimed
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
        ok = post(s, "/v1/generate", GEN, "v")
        assert ok.status_code == 200 and "idempotent-replayed" not in ok.headers
        over = post(s, "/v1/generate", {**GEN, "max_new_tokens": 100_000}, "b")  # the budget: claimed, released
        assert over.status_code == 422 and over.json()["error"]["type"] == "context_length_exceeded"
        ok = post(s, "/v1/generate", {**GEN, "max_new_tokens": 3}, "b")
        assert ok.status_code == 200 and "idempotent-replayed" not in ok.headers
        missing = post(s, "/v1/chat/completions", {**CHAT, "model": "nope"}, "m")
        assert missing.status_code == 404
        assert post(s, "/v1/chat/completions", CHAT, "m").status_code == 200
        assert sorted(r.key for r in rows(s)) == ["b", "m", "v"]


def test_an_answer_the_work_gave_is_stored_even_a_500(db_url: str) -> None:
    """As Stripe does: once execution began, its answer is the answer, an internal error included."""
    with served(db_url) as s:
        s.srv.runner.fail = True
        failed = post(s, "/v1/generate", GEN, "f")
        assert failed.status_code == 500 and failed.json()["error"]["type"] == "internal_error"
        s.srv.runner.fail = False
        again = post(s, "/v1/generate", GEN, "f")
        assert again.status_code == 500 and again.headers["idempotent-replayed"] == "true"
        assert again.content == failed.content


def test_429_is_not_stored_and_a_replay_costs_no_tokens(db_url: str) -> None:
    with served(db_url) as s:
        secret = create_key(s.admin, "limited", {Scope.GENERATE}, tpm=1, burst=20)[1]
        wait_for(lambda: status(s.url, "/v1/models") == 401)
        first = post(s, "/v1/generate", GEN, "paid", **auth(secret))
        assert first.status_code == 200
        left = int(first.headers["x-ratelimit-remaining-tokens"])
        refused = post(s, "/v1/generate", GEN, "refused", **auth(secret))  # the bucket holds less than 16
        assert refused.status_code == 429
        assert [r.key for r in rows(s)] == ["paid"]  # the 429 released its claim
        replay = post(s, "/v1/generate", GEN, "paid", **auth(secret))
        assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
        used = first.json()["usage"]
        settled = 20 - used["prompt_tokens"] - used["completion_tokens"]
        assert int(replay.headers["x-ratelimit-remaining-tokens"]) == settled >= left  # nothing reserved
        assert finished(s) == 1


def test_keys_are_scoped_to_the_api_key(db_url: str) -> None:
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        _, b = s.key(Scope.GENERATE)
        wait_for(lambda: status(s.url, "/v1/models") == 401)
        other = {**GEN, "prompt": "Another prompt"}
        mine = post(s, "/v1/generate", GEN, "shared", **auth(a))
        theirs = post(s, "/v1/generate", other, "shared", **auth(b))
        assert mine.status_code == theirs.status_code == 200
        assert "idempotent-replayed" not in theirs.headers  # b's "shared" is not a's
        assert post(s, "/v1/generate", GEN, "shared", **auth(a)).content == mine.content
        assert post(s, "/v1/generate", other, "shared", **auth(b)).content == theirs.content
        assert post(s, "/v1/generate", other, "shared", **auth(a)).status_code == 422
        assert finished(s) == 2


@pytest.mark.parametrize("value", ["", "a b", "x" * 256, "caf\u00e9", "tab\there", '"unterminated'])
def test_a_malformed_key_is_refused_by_name(db_url: str, value: str) -> None:
    with served(db_url) as s:
        r = httpx.post(s.url + "/v1/generate", json=GEN, headers={"Idempotency-Key": value.encode("utf-8")})
        assert r.status_code == 422
        err = r.json()["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request", "invalid_idempotency_key",
                                                            "Idempotency-Key")
        r = httpx.post(s.url + "/v1/completions", json=COMPLETION, headers={"Idempotency-Key": value.encode()})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_idempotency_key"
        assert finished(s) == 0


def test_one_key_twice_is_refused_and_the_longest_key_is_taken(db_url: str) -> None:
    with served(db_url) as s:
        twice = httpx.post(s.url + "/v1/generate", json=GEN,
                           headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
        assert twice.status_code == 422 and twice.json()["error"]["param"] == "Idempotency-Key"
        longest = "~" + "k" * 253 + "!"
        assert post(s, "/v1/generate", GEN, longest).status_code == 200
        assert post(s, "/v1/generate", GEN, longest).headers["idempotent-replayed"] == "true"


def test_the_ttl_is_configurable() -> None:
    from tests.api.threaded_server import threaded_server

    with threaded_server(Config(idempotency=IdempotencyConfig(ttl_hours=0.5))) as srv:
        assert srv.state.tenancy.idempotency.ttl.total_seconds() == 1800
