"""The usage ledger through the API over a real socket, on SQLite and Postgres: every metered request's tokens
by key and day (streams at their end), `admin` sees every key, nobody else sees another's."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from sluicegate.tenancy.keys import Scope, new_secret
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import GEN, auth, served
from tests.api.threaded_server import SlowRunner

CHAT: dict[str, Any] = {"model": "reference", "messages": [{"role": "user", "content": "Hi there"}],
                        "max_tokens": 6, "temperature": 0}


def never_ending() -> SlowRunner:
    return SlowRunner(n_ctx=2048, n_slots=4, eos_slope=0.0)  # every run generates exactly max_tokens


def usage(url: str, secret: str, **params: str) -> httpx.Response:
    return httpx.get(url + "/v1/usage", headers=auth(secret), params=params, timeout=30)


def stream_events(url: str, secret: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, headers=auth(secret), timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_usage_by_key_streams_included(db_url: str) -> None:
    with served(db_url, runner=never_ending) as s:
        a, key_a = s.key(Scope.GENERATE, name="a")
        b, key_b = s.key(Scope.GENERATE, name="b")
        _, key_admin = s.key(Scope.ADMIN, name="ops")
        want_a = [0, 0, 0]
        for prompt in ("one", "two words"):
            r = httpx.post(s.url + "/v1/generate", json={**GEN, "prompt": prompt}, headers=auth(key_a))
            u = r.json()["usage"]
            want_a = [want_a[0] + u["prompt_tokens"], want_a[1] + u["prompt_tokens_details"]["cached_tokens"],
                      want_a[2] + u["completion_tokens"]]
        refused = httpx.post(s.url + "/v1/generate", json={**GEN, "max_new_tokens": -1}, headers=auth(key_a))
        assert refused.status_code == 422

        whole = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers=auth(key_b)).json()["usage"]
        with_usage = stream_events(s.url, key_b, "/v1/chat/completions",
                                   {**CHAT, "stream_options": {"include_usage": True}})[-1]["usage"]
        stream_events(s.url, key_b, "/v1/chat/completions", CHAT)  # no usage chunk: the ledger counts anyway
        text = {"model": "reference", "prompt": "Hi there", "max_tokens": 5, "temperature": 0}
        stream_events(s.url, key_b, "/v1/completions", text)
        assert whole["completion_tokens"] == with_usage["completion_tokens"] == 6

        (mine,) = usage(s.url, key_a).json()["data"]
        assert mine["key_id"] == a.id and mine["requests"] == 3 and mine["failed_requests"] == 1
        assert [mine["prompt_tokens"], mine["cached_tokens"], mine["generated_tokens"]] == want_a
        assert mine["total_tokens"] == want_a[0] + want_a[2]

        (theirs,) = usage(s.url, key_b).json()["data"]
        assert theirs["key_id"] == b.id and theirs["requests"] == 4 and theirs["failed_requests"] == 0
        assert theirs["generated_tokens"] == 6 + 6 + 6 + 5
        assert theirs["prompt_tokens"] >= 3 * whole["prompt_tokens"]
        assert theirs["cached_tokens"] <= theirs["prompt_tokens"]

        every = usage(s.url, key_admin).json()["data"]
        assert sorted(d["key_id"] for d in every) == sorted([a.id, b.id])
        assert usage(s.url, key_admin, key_id=b.id).json()["data"] == [theirs]
        assert usage(s.url, key_a, key_id=a.id).json()["data"] == [mine]
        r = usage(s.url, key_a, key_id=b.id)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_denied"
        assert r.json()["error"]["param"] == "key_id" and b.id not in r.text
        r = usage(s.url, key_a, since="2024-01-01")
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_field"


def test_usage_without_keys_is_everyones(db_url: str) -> None:
    with served(db_url) as s:
        assert httpx.post(s.url + "/v1/generate", json=GEN).status_code == 200
        r = httpx.get(s.url + "/v1/usage")
        (day,) = r.json()["data"]
        assert day["key_id"] is None and day["requests"] == 1 and day["generated_tokens"] >= 1


def test_a_stream_the_client_leaves_is_counted_to_where_it_stopped(db_url: str) -> None:
    with served(db_url, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, eos_slope=0.0, delay_s=0.01)) as s:
        _, key = s.key(Scope.GENERATE)
        body = {**CHAT, "max_tokens": 500, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, headers=auth(key), timeout=30) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    seen += 1
                if seen >= 3:
                    break
        engine = s.srv.state.runtime.engine
        assert engine is not None

        def counted() -> list[Any]:
            return usage(s.url, key).json()["data"]  # type: ignore[no-any-return]

        wait_for(lambda: bool(counted()))
        (day,) = counted()
        assert day["requests"] == 1
        assert 3 <= day["generated_tokens"] < 500 and day["prompt_tokens"] > 0


def test_the_openai_client_maps_401_and_403(db_url: str) -> None:
    with served(db_url) as s:
        _, gen = s.key(Scope.GENERATE)
        _, batch = s.key(Scope.BATCH)
        msgs: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key="sk-unused", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError) as info:
                c.chat.completions.create(model="reference", messages=msgs, max_tokens=2)
            assert info.value.status_code == 401 and info.value.code == "malformed_api_key"
            assert isinstance(info.value.body, dict)
            assert info.value.body["request_id"] == info.value.response.headers["x-request-id"]
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key=new_secret(), max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError) as info:
                c.models.list()
            assert info.value.type == "invalid_api_key"
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key=batch, max_retries=0) as c:
            with pytest.raises(openai.PermissionDeniedError) as denied:
                c.completions.create(model="reference", prompt="Hi", max_tokens=2)
            assert denied.value.status_code == 403 and denied.value.type == "permission_denied"
            assert [m.id for m in c.models.list()] == ["reference"]
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key=gen, max_retries=0) as c:
            out = c.chat.completions.create(model="reference", messages=msgs, max_tokens=2)
            assert out.usage is not None
