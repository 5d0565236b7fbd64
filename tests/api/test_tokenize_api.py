"""`POST /tokenize` and `/detokenize` (vLLM's shape): the counts the generating surfaces charge, the
envelope for bad input, and the `generate` scope."""

from __future__ import annotations

from fastapi.testclient import TestClient

from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import auth, served

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def test_a_prompts_count_is_what_generate_charges(client: TestClient) -> None:
    r = client.post("/tokenize", json={"prompt": "Hello there, naïve café"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    g = client.post("/v1/generate", json={"prompt": "Hello there, naïve café", "max_new_tokens": 1})
    assert g.json()["usage"]["prompt_tokens"] == body["count"]
    plain = client.post("/tokenize", json={"prompt": "Hello there, naïve café", "add_special_tokens": False})
    assert plain.json()["tokens"] == body["tokens"][-plain.json()["count"]:]


def test_messages_count_is_what_chat_charges(client: TestClient) -> None:
    r = client.post("/tokenize", json={"model": "reference", "messages": MSGS})
    assert r.status_code == 200, r.text
    chat = client.post("/v1/chat/completions", json={"model": "reference", "messages": MSGS, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == r.json()["count"]
    shorter = client.post("/tokenize", json={"messages": MSGS, "add_generation_prompt": False})
    assert shorter.json()["count"] < r.json()["count"]


def test_detokenize_inverts_tokenize(client: TestClient) -> None:
    ids = client.post("/tokenize", json={"prompt": "Hello, 東京", "add_special_tokens": False}).json()["tokens"]
    r = client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "Hello, 東京"}


def test_bad_input_is_refused_in_the_envelope(client: TestClient) -> None:
    cases = [
        ({}, 422, "prompt"),
        ({"prompt": "a", "messages": MSGS}, 422, "prompt"),
        ({"prompt": "a", "model": "nope"}, 404, "model"),
        ({"prompt": 5}, 422, "prompt"),
        ({"prompt": "a", "extra": 1}, 422, "extra"),
    ]
    for body, status, param in cases:
        r = client.post("/tokenize", json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param
    r = client.post("/detokenize", json={"tokens": [0, 10**6]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "tokens[1]"
    assert "1000000" not in r.json()["error"]["message"]


def test_the_generate_scope_guards_both(db_url: str) -> None:
    import httpx

    with served(db_url) as s:
        _, batch_only = s.key(Scope.BATCH)
        _, gen = s.key(Scope.GENERATE)
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
            assert httpx.post(s.url + path, json=body).status_code == 401
            assert httpx.post(s.url + path, json=body, headers=auth(batch_only)).status_code == 403
            assert httpx.post(s.url + path, json=body, headers=auth(gen)).status_code == 200
