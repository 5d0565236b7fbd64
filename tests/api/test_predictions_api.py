"""`/v1/predictions` over a real socket on SQLite and Postgres: create, fetch by its key only, list with a
cursor, refusals in the envelope, Idempotency-Key replays, the usage ledger; `GET /v1/models/{id}`'s card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from sluicegate.config import Config, JobsConfig, LimitsConfig
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import auth, served
from tests.dbs import sqlite_url

BODY: dict[str, Any] = {"input": {"prompt": "Hello there"}, "options": {"max_new_tokens": 4, "temperature": 0},
                        "metadata": {"run": "1"}}


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path)
    upgrade(url)
    return url


def post(url: str, secret: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/predictions", json=body, headers={**auth(secret), **headers}, timeout=60)


def test_create_get_and_other_keys(db_url: str) -> None:
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        _, b = s.key(Scope.GENERATE)
        r = post(s.url, a, BODY)
        assert r.status_code == 200, r.text
        rec = r.json()
        assert rec["object"] == "prediction" and rec["id"].startswith("pred_")
        assert set(rec) == {"id", "object", "created_at", "model", "metadata", "result", "usage", "warnings",
                            "timing"}
        assert rec["created_at"].endswith("Z") and rec["metadata"] == {"run": "1"}
        assert rec["model"]["ref"] == f"{rec['model']['name']}@{rec['model']['version']}"
        assert rec["usage"]["output_tokens"] == len(rec["result"]["token_ids"]) <= 4
        got = httpx.get(f"{s.url}/v1/predictions/{rec['id']}", headers=auth(a), timeout=30)
        assert got.status_code == 200 and got.json() == rec
        other = httpx.get(f"{s.url}/v1/predictions/{rec['id']}", headers=auth(b), timeout=30)
        assert other.status_code == 404 and other.json()["error"]["type"] == "not_found"
        assert httpx.get(f"{s.url}/v1/predictions/pred_nope", headers=auth(a), timeout=30).status_code == 404
        assert httpx.get(f"{s.url}/v1/predictions", headers=auth(b), timeout=30).json()["data"] == []


def test_scope_and_usage(db_url: str) -> None:
    with served(db_url) as s:
        _, batch_only = s.key(Scope.BATCH)
        r = post(s.url, batch_only, BODY)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_denied"
        _, a = s.key(Scope.GENERATE)
        rec = post(s.url, a, BODY).json()
        httpx.get(f"{s.url}/v1/predictions", headers=auth(a), timeout=30)  # reading costs nothing: no row
        days = httpx.get(f"{s.url}/v1/usage", headers=auth(a), timeout=30).json()["data"]
        assert len(days) == 1 and days[0]["requests"] == 1
        assert days[0]["prompt_tokens"] == rec["usage"]["input_tokens"]
        assert days[0]["generated_tokens"] == rec["usage"]["output_tokens"]


def test_list_pages_with_a_cursor(db_url: str) -> None:
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        made = [post(s.url, a, {**BODY, "metadata": {"i": str(i)}}).json()["id"] for i in range(5)]
        seen: list[str] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
            page = httpx.get(f"{s.url}/v1/predictions", params=params, headers=auth(a), timeout=30).json()
            assert page["object"] == "list" and len(page["data"]) <= 2
            seen += [p["id"] for p in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
            assert after == page["data"][-1]["id"]
        assert seen == made[::-1]  # newest first, each once
        bad = httpx.get(f"{s.url}/v1/predictions", params={"limit": 0}, headers=auth(a), timeout=30)
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "limit"
        for after_value in ("pred_" + "0" * 24, "x"):
            bad = httpx.get(f"{s.url}/v1/predictions", params={"after": after_value}, headers=auth(a), timeout=30)
            assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_cursor"
        bad = httpx.get(f"{s.url}/v1/predictions", params={"page": 2}, headers=auth(a), timeout=30)
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "page"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": {"prompt": "a"}, "options": {"temperature": -1}}, 422, "options.temperature"),
    ({"input": {"prompt": "a"}, "options": {"logprobs": 2}}, 422, "options.logprobs"),
    ({"input": {"prompt": "a"}, "options": {"max_new_tokens": 5000}}, 422, "options.max_new_tokens"),
    ({"input": {}}, 422, "input"),
    ({"input": {"prompt": "a"}, "model": "nope"}, 404, "model"),
])
def test_refusals(sqlite_db: str, body: dict[str, Any], status: int, param: str) -> None:
    config = Config(limits=LimitsConfig(max_new_tokens=100))
    with served(sqlite_db, config) as s:
        _, a = s.key(Scope.GENERATE)
        r = post(s.url, a, body)
        assert r.status_code == status and r.json()["error"]["param"] == param
        assert "Traceback" not in r.text


def test_unknown_version_lists_the_available_one(db_url: str) -> None:
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        ident = s.srv.state.runtime.served().identity
        r = post(s.url, a, {**BODY, "model": f"{ident.name}@v999"})
        err = r.json()["error"]
        assert r.status_code == 404 and err["code"] == "model_version_not_found" and ident.version in err["message"]
        assert post(s.url, a, {**BODY, "model": ident.ref}).status_code == 200


def test_idempotency_key_replays_the_same_prediction(db_url: str) -> None:
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        first = post(s.url, a, BODY, **{"Idempotency-Key": "k1"})
        again = post(s.url, a, BODY, **{"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 200
        assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
        page = httpx.get(f"{s.url}/v1/predictions", headers=auth(a), timeout=30).json()
        assert [p["id"] for p in page["data"]] == [first.json()["id"]]  # made and stored once


def test_model_card(sqlite_db: str) -> None:
    config = Config(limits=LimitsConfig(max_new_tokens=100, max_prompt_tokens=300),
                    jobs=JobsConfig(max_items_per_job=7, max_file_bytes=1234))
    with served(sqlite_db, config) as s:
        _, a = s.key(Scope.GENERATE)
        ident = s.srv.state.runtime.served().identity
        for model_id in (ident.name, ident.ref):
            r = httpx.get(f"{s.url}/v1/models/{model_id}", headers=auth(a), timeout=30)
            card = r.json()
            assert r.status_code == 200 and card["id"] == ident.name and card["object"] == "model"
            assert card["versions"] == [ident.version] and ident.ref in card["aliases"]
            assert card["digest"] == ident.digest and card["context_window"] == 2048
            assert card["limits"] == {
                "max_body_bytes": 1 << 20, "max_prompt_tokens": 300, "max_new_tokens": 100, "max_batch_items": 7,
                "max_file_bytes": 1234, "max_stored_bytes": 10 << 30, "max_concurrent_jobs": 8,
                "max_enqueued_tokens": 10_000_000,
            }
            assert card["defaults"]["model"] == ident.ref and card["defaults"]["options"]["max_new_tokens"] == 16
        # the schemas describe what the server accepts and refuses
        jsonschema.validate({"prompt": "x"}, card["schemas"]["input"])
        jsonschema.validate({"temperature": 0.5, "stop": ["a"]}, card["schemas"]["options"])
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"temperature": 5}, card["schemas"]["options"])
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
                                card["schemas"]["input"])
        r = httpx.get(f"{s.url}/v1/models/{ident.name}@nope", headers=auth(a), timeout=30)
        err = r.json()["error"]  # OpenAI's shape on this route: its code, the versions in the message
        assert r.status_code == 404 and err["code"] == "model_not_found" and ident.version in err["message"]


def test_same_answer_as_generate_and_chat(sqlite_db: str) -> None:
    """One adapter on the serving core: a prompt prediction is /v1/generate's answer, a messages prediction is
    chat completions' answer (same template, same tokens), for the same seeded request."""
    with served(sqlite_db) as s:
        _, a = s.key(Scope.GENERATE)
        opts = {"max_new_tokens": 6, "temperature": 0.8, "seed": 11}
        pred = post(s.url, a, {"input": {"prompt": "Once upon"}, "options": opts}).json()
        gen = httpx.post(f"{s.url}/v1/generate", json={"prompt": "Once upon", **opts}, headers=auth(a),
                         timeout=60).json()
        assert pred["result"]["token_ids"] == gen["token_ids"] and pred["result"]["text"] == gen["text"]
        assert pred["usage"]["input_tokens"] == gen["usage"]["prompt_tokens"]
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        pred = post(s.url, a, {"input": {"messages": messages}, "options": opts}).json()
        chat = httpx.post(f"{s.url}/v1/chat/completions", json={
            "model": pred["model"]["name"], "messages": messages, "max_tokens": 6, "temperature": 0.8, "seed": 11,
        }, headers=auth(a), timeout=60).json()
        assert pred["result"]["text"] == chat["choices"][0]["message"]["content"]
        assert pred["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
