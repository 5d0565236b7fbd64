"""Per-key batch limits over a real socket, each refused in the envelope with its number; the upload routes'
own body limit beside the JSON routes' one."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import pytest

from sluicegate.config import Config, JobsConfig, LimitsConfig
from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server
from tests.jobs.helpers import chat_line, jsonl, poll_seed

LIMITS = JobsConfig(max_items_per_job=3, max_file_bytes=4000, max_concurrent_jobs=1, max_enqueued_tokens=2000,
                    poll_s=0.05)


@pytest.fixture(scope="module")
def server() -> Iterator[Threaded]:
    config = Config(jobs=LIMITS, limits=LimitsConfig(max_body_bytes=2000))
    with threaded_server(config, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4)) as srv:
        yield srv


@pytest.fixture
def client(server: Threaded) -> Iterator[httpx.Client]:
    server.runner.delay_s = 0.0
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def upload(client: httpx.Client, data: bytes, purpose: str = "batch") -> httpx.Response:
    return client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": purpose})


def test_items_per_job(client: httpx.Client) -> None:
    r = client.post("/v1/batch-predictions", json=[{"input": {"prompt": "x"}}] * 4)
    err = r.json()["error"]
    assert r.status_code == 422 and err["code"] == "too_many_items" and "at most 3 requests" in err["message"]
    f = upload(client, jsonl([chat_line(i) for i in range(4)])).json()
    r = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_items"
    assert "at most 3 requests" in r.json()["error"]["message"]
    assert client.get("/v1/batches").json()["data"] == []  # the refused job left nothing behind


def test_file_bytes_refused_while_streaming_with_the_number(client: httpx.Client) -> None:
    r = upload(client, b"x" * 4001)
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
    assert "4000 bytes" in r.json()["error"]["message"]
    for size in (30_000, 3_000_000):  # past the route's limit, then past the middleware's: a clean 413 either way
        r = upload(client, b"x" * size)
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large"
    assert all(f["bytes"] != 4001 for f in client.get("/v1/files").json()["data"])  # nothing half-written listed
    # the upload route takes more than the JSON routes' 2000 bytes: it has its own limit
    assert upload(client, jsonl([chat_line(i) for i in range(3)]) + b" " * 1500).status_code == 200
    big_json = [{"input": {"prompt": "y" * 900}}, {"input": {"prompt": "z" * 900}}, {"input": {"prompt": "w" * 300}}]
    r = client.post("/v1/batch-predictions", json=big_json)
    assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"]  # a JSON list: the JSON limit
    r = client.post("/v1/batch-predictions", content=b"\n".join(json.dumps(x).encode() for x in big_json),
                    headers={"content-type": "application/jsonl"})
    assert r.status_code == 202, r.text  # the same requests as JSONL: the upload limit
    poll_seed(client, r.json()["id"])
    r = client.post("/v1/batch-predictions", content=b"\n" * 4001, headers={"content-type": "application/jsonl"})
    assert r.status_code == 413 and "4000 bytes" in r.json()["error"]["message"]


def test_purpose_and_form_refusals(client: httpx.Client) -> None:
    r = upload(client, b"{}\n", purpose="fine-tune")
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = client.post("/v1/files", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 415
    r = client.post("/v1/files", data={"purpose": "batch"}, files={"other": ("a", b"1")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


def test_enqueued_tokens_and_concurrent_jobs(server: Threaded, client: httpx.Client) -> None:
    r = client.post("/v1/batch-predictions", json=[{"input": {"prompt": "x"}, "options": {"max_new_tokens": 1500}}] * 2)
    assert r.status_code == 429 and r.json()["error"]["code"] == "enqueued_tokens_limit"
    assert "2000" in r.json()["error"]["message"]
    server.runner.delay_s = 0.05
    first = client.post("/v1/batch-predictions", json=[{"input": {"prompt": "x"}, "options": {"max_new_tokens": 200,
                                                                                             "temperature": 0}}])
    assert first.status_code == 202
    r = client.post("/v1/batch-predictions", json=[{"input": {"prompt": "y"}}])
    assert r.status_code == 429 and r.json()["error"]["code"] == "concurrent_jobs_limit"
    assert "limit is 1" in r.json()["error"]["message"] and r.headers["retry-after"]
    client.delete(f"/v1/batch-predictions/{first.json()['id']}")
    wait_for(lambda: client.post("/v1/batch-predictions", json=[{"input": {"prompt": "y"}}]).status_code == 202,
             message="the slot to free")
