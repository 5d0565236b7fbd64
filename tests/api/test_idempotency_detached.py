"""Idempotent work outlives its client, over a real socket on SQLite and Postgres: the same key while the first
request runs is 409 with Retry-After; a client that timed out mid-generation (or left a stream) and retries
gets 409, then the stored answer, and the engine generates once; the usage ledger and the rate limit count the
work once; the official `openai` client retries the 409 by itself.

The runner's steps wait on a gate the test holds, so "still running" is a state the test controls, never a race
against the clock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import REGISTRY

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.config import Config, IdempotencyConfig
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import Served, auth, served, status
from tests.api.threaded_server import SlowRunner

NEW_TOKENS = 40
# a request meeting its key in use waits for the holder before 409 (api/idempotency.py); here the holder is held
# on purpose, so the wait is short: these tests are about what comes after it
QUICK_409 = Config(idempotency=IdempotencyConfig(in_use_wait_s=0.3))


class GatedRunner(SlowRunner):
    """The reference model, whose steps wait while `gate` is clear; `waiting` is set once one waits."""

    def __init__(self, **kw: int) -> None:
        super().__init__(eos_slope=0.0, **kw)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        return super().execute(batch)


def gated_runner() -> GatedRunner:
    return GatedRunner(n_ctx=2048, n_slots=4)


@contextmanager
def held(s: Served) -> Iterator[GatedRunner]:
    """The engine's steps wait until the block ends (or the test opens the gate itself)."""
    runner = s.srv.runner
    assert isinstance(runner, GatedRunner)
    runner.waiting.clear()
    runner.gate.clear()
    try:
        yield runner
    finally:
        runner.gate.set()


def stats(s: Served) -> Any:
    engine = s.srv.state.runtime.engine
    assert engine is not None
    return engine.stats


def conflicts() -> float:
    """409 idempotency_key_in_use envelopes this process has sent (the error counter /metrics exports)."""
    return REGISTRY.get_sample_value("sluicegate_request_errors_total", {"type": "idempotency_key_in_use"}) or 0.0


def limited(s: Served) -> str:
    secret = create_key(s.admin, "limited", {Scope.GENERATE}, tpm=1, burst=1000)[1]
    wait_for(lambda: status(s.url, "/v1/models") == 401)
    return secret


def until_answered(s: Served, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[httpx.Response,
                                                                                                     int]:
    """Retry as a client would while the answer is 409; the answer and how many 409s came first."""
    conflicts = 0
    while True:
        r = httpx.post(s.url + path, json=body, headers=headers, timeout=60)
        if r.status_code != 409:
            return r, conflicts
        conflicts += 1
        assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "idempotency_key_in_use"
        wait_for(lambda: not stats(s).running, 60)  # instead of sleeping Retry-After


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/chat/completions"])
def test_the_same_key_while_the_first_runs_is_409(db_url: str, path: str) -> None:
    body: dict[str, Any] = ({"prompt": "Hello", "max_new_tokens": NEW_TOKENS} if path == "/v1/generate" else
                            {"model": "reference", "messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": NEW_TOKENS})
    with served(db_url, QUICK_409, runner=gated_runner) as s:
        got: list[httpx.Response] = []
        with held(s) as runner:
            first = threading.Thread(target=lambda: got.append(
                httpx.post(s.url + path, json=body, headers={"Idempotency-Key": "busy"}, timeout=60)))
            first.start()
            assert runner.waiting.wait(60)  # the first request is in the engine
            busy = httpx.post(s.url + path, json=body, headers={"Idempotency-Key": "busy"}, timeout=60)
            assert busy.status_code == 409  # 409 on the OpenAI route too: its SDK retries it
            assert busy.headers["retry-after"] == "1"
            err = busy.json()["error"]
            assert err["type"] == "idempotency_key_in_use" and err["param"] == "Idempotency-Key"
            other = httpx.post(s.url + path, json={**body, "max_tokens" if "chat" in path else "max_new_tokens": 3},
                               headers={"Idempotency-Key": "busy"}, timeout=60)
            assert other.status_code in (400, 422)  # another request: reused, whether or not the first runs
        first.join(60)
        (answer,) = got
        assert answer.status_code == 200
        again = httpx.post(s.url + path, json=body, headers={"Idempotency-Key": "busy"}, timeout=60)
        assert again.headers["idempotent-replayed"] == "true" and again.content == answer.content
        assert stats(s).requests_finished == 1


def test_a_retry_after_a_client_timeout_mid_generation_generates_once(db_url: str) -> None:
    body = {"prompt": "Hello there", "max_new_tokens": NEW_TOKENS, "temperature": 0}
    with served(db_url, QUICK_409, runner=gated_runner) as s:
        secret = limited(s)
        headers = {**auth(secret), "Idempotency-Key": "timed-out"}
        with held(s) as runner:
            with pytest.raises(httpx.ReadTimeout):  # the engine is held: no answer can come in time
                httpx.post(s.url + "/v1/generate", json=body, headers=headers, timeout=httpx.Timeout(60, read=0.5))
            assert runner.waiting.wait(60)
            busy = httpx.post(s.url + "/v1/generate", json=body, headers=headers, timeout=60)
            assert busy.status_code == 409  # the work went on without its client
        answer, _ = until_answered(s, "/v1/generate", body, headers)
        assert answer.status_code == 200 and answer.headers["idempotent-replayed"] == "true"
        assert answer.json()["usage"]["completion_tokens"] == NEW_TOKENS
        assert stats(s).requests_finished == 1 and stats(s).generated_tokens == NEW_TOKENS  # generated once
        cost = answer.json()["usage"]["total_tokens"]
        assert int(answer.headers["x-ratelimit-remaining-tokens"]) == 1000 - cost  # charged once, settled

        def generated() -> int:
            r = httpx.get(s.url + "/v1/usage", headers=auth(secret), timeout=30)
            return int(r.json()["data"][0]["generated_tokens"]) if r.json()["data"] else -1

        wait_for(lambda: generated() == NEW_TOKENS)  # the ledger too (the first request's row, 499)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_the_client_left_runs_on_and_is_replayed_whole(db_url: str, path: str) -> None:
    body: dict[str, Any] = {"model": "reference", "max_tokens": NEW_TOKENS, "stream": True, "temperature": 0,
                            "stream_options": {"include_usage": True}}
    body |= {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    with served(db_url, QUICK_409, runner=gated_runner) as s:
        headers = {"Idempotency-Key": "left"}
        seen = b""
        with held(s) as runner:
            with httpx.stream("POST", s.url + path, json=body, headers=headers, timeout=60) as r:
                assert r.status_code == 200
                if "chat" in path:  # the role comes first, before any token
                    seen = next(r.iter_raw())
                assert runner.waiting.wait(60)
            # the client has gone; the producer waits on the engine, and so would a retry
            assert httpx.post(s.url + path, json=body, headers=headers, timeout=60).status_code == 409
        answer, _ = until_answered(s, path, body, headers)
        assert answer.status_code == 200 and answer.headers["idempotent-replayed"] == "true"
        assert answer.content.startswith(seen) and answer.content.endswith(b"data: [DONE]\n\n")
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
        assert events[-1]["usage"]["completion_tokens"] == NEW_TOKENS
        assert stats(s).requests_finished == 1 and stats(s).generated_tokens == NEW_TOKENS


def test_the_openai_client_retries_the_409_until_the_stored_answer(db_url: str) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    key = {"Idempotency-Key": "sdk-1"}
    with served(db_url, QUICK_409, runner=gated_runner) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=20, timeout=60)
        firsts: list[Any] = []
        retried: list[Any] = []
        before = conflicts()
        with held(s) as runner:
            first = threading.Thread(target=lambda: firsts.append(client.chat.completions.create(
                model="reference", messages=messages, max_tokens=8, extra_headers=key)))
            first.start()
            assert runner.waiting.wait(60)
            second = threading.Thread(target=lambda: retried.append(
                client.chat.completions.with_raw_response.create(
                    model="reference", messages=messages, max_tokens=8, extra_headers=key)))
            second.start()
            wait_for(lambda: conflicts() > before)  # the SDK got its 409 and will retry it
        first.join(60)
        second.join(60)
        (raw,) = retried
        assert raw.headers["idempotent-replayed"] == "true"
        assert raw.parse() == firsts[0]  # the same completion: its id, its text
        assert stats(s).requests_finished == 1
