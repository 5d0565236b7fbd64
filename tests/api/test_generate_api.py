"""/v1/generate in process, on the reference backend."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from sluicegate.backends.reference import ReferenceRunner
from tests.conftest import make_client, wait_ready


def test_generate_contract(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "héllo", "max_new_tokens": 5, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == r.headers["x-request-id"]
    assert body["model"]["name"] == "reference"
    assert body["usage"]["prompt_tokens"] == 1 + len("héllo".encode())  # BOS + bytes
    assert body["usage"]["completion_tokens"] == len(body["token_ids"])
    assert body["seed"] is None
    # same request again: greedy is reproducible
    again = client.post("/v1/generate", json={"prompt": "héllo", "max_new_tokens": 5, "temperature": 0}).json()
    assert again["token_ids"] == body["token_ids"]


def test_seed_is_reported_and_replays(client: TestClient) -> None:
    first = client.post("/v1/generate", json={"prompt": "abc", "max_new_tokens": 12}).json()
    assert isinstance(first["seed"], int)
    replay = client.post("/v1/generate", json={"prompt": "abc", "max_new_tokens": 12, "seed": first["seed"]}).json()
    assert replay["token_ids"] == first["token_ids"]


def test_caller_request_id_is_echoed_and_invalid_one_replaced(client: TestClient) -> None:
    r = client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = client.get("/healthz", headers={"X-Request-Id": "bad id with spaces"})
    assert r.headers["x-request-id"].startswith("req_")


def test_warning_for_ineffective_combination(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1, "temperature": 0, "top_p": 0.5})
    assert r.status_code == 200
    assert r.json()["warnings"] == ["top_p has no effect at temperature 0 (greedy decoding)"]


def test_not_ready_while_loading_then_ready() -> None:
    gate = threading.Event()

    def slow_factory() -> ReferenceRunner:
        gate.wait(10)
        return ReferenceRunner()

    with make_client(factory=slow_factory) as c:
        assert c.get("/healthz").status_code == 200
        r = c.get("/readyz")
        assert r.status_code == 503
        assert r.headers["retry-after"] == "2"
        assert r.json()["error"]["type"] == "not_ready"
        g = c.post("/v1/generate", json={"prompt": "a"})
        assert g.status_code == 503 and g.json()["error"]["code"] == "loading"
        gate.set()
        wait_ready(c)
        assert c.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1}).status_code == 200


def test_load_failure_is_reported_not_hidden() -> None:
    def broken() -> ReferenceRunner:
        raise OSError("disk on fire")

    with make_client(factory=broken) as c:
        for _ in range(100):
            r = c.get("/readyz")
            if r.json()["error"]["code"] == "load_failed":
                break
        assert r.status_code == 503
        assert "disk" not in r.text
