"""Batch input read with a request body's limits, over a real socket: a line nested thousands deep is that
line's failure (the seed shape's failed item, the OpenAI shape's validation error), never a 500 nor a job
left `validating`; and a job left `validating` (its process died reading the input) is failed by the sweeper,
which frees its slot of the key's concurrency limit."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import pytest

from sluicegate.config import Config, JobsConfig
from sluicegate.serving.strict_json import MAX_DEPTH
from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server
from tests.jobs.helpers import chat_line, jsonl, poll_seed

DEEP = 5000


def deep_line(n: int) -> bytes:
    return b'{"input": {"prompt": "x"}, "extra": ' + b"[" * n + b"]" * n + b"}"


@pytest.fixture(scope="module")
def server() -> Iterator[Threaded]:
    config = Config(jobs=JobsConfig(poll_s=0.05, max_concurrent_jobs=1, validating_timeout_s=1.0))
    with threaded_server(config, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4)) as srv:
        yield srv


@pytest.fixture
def client(server: Threaded) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_a_deep_jsonl_line_fails_its_item_and_the_rest_run(client: httpx.Client) -> None:
    good = json.dumps({"input": {"prompt": "hello"}, "options": {"max_new_tokens": 2}}).encode()
    body = good + b"\n" + deep_line(DEEP) + b"\n" + good + b"\n"
    r = client.post("/v1/batch-predictions", content=body, headers={"content-type": "application/jsonl"})
    assert r.status_code == 202, r.text
    job = poll_seed(client, r.json()["id"])
    assert job["status"] == "succeeded" and job["progress"] == {"done": 3, "total": 3, "failed": 1}
    results = {x["line"]: x for x in client.get(f"/v1/batch-predictions/{job['id']}/results").json()["data"]}
    assert results[1]["status"] == results[3]["status"] == "succeeded"
    bad = results[2]["error"]
    assert bad["line"] == 2 and bad["code"] == "too_deep" and f"deeper than {MAX_DEPTH} levels" in bad["message"]
    assert "[" not in bad["message"]  # the input is never echoed


def test_a_line_at_the_request_depth_limit_is_taken(client: httpx.Client) -> None:
    body = json.dumps({"input": {"prompt": "x"}, "options": {"max_new_tokens": 2}}).encode()[:-1]
    line = body + b', "metadata": {"a": ' + b"[" * (MAX_DEPTH - 2) + b"]" * (MAX_DEPTH - 2) + b"}}"
    r = client.post("/v1/batch-predictions", content=line, headers={"content-type": "application/jsonl"})
    assert r.status_code == 202, r.text
    results = client.get(f"/v1/batch-predictions/{poll_seed(client, r.json()['id'])['id']}/results").json()["data"]
    # the depth a request body may have is a line's too
    assert (results[0].get("error") or {}).get("code") != "too_deep"


def test_a_deep_json_list_is_refused_with_400(client: httpx.Client) -> None:
    body = b'[{"input": {"prompt": "x"}, "extra": ' + b"[" * DEEP + b"]" * DEEP + b"}]"
    before = len(client.get("/v1/batch-predictions").json()["data"])
    r = client.post("/v1/batch-predictions", content=body, headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "too_deep" and f"{MAX_DEPTH + 1} levels" in err["message"]
    assert len(client.get("/v1/batch-predictions").json()["data"]) == before  # no job left behind


def test_a_deep_openai_line_fails_validation_not_the_server(client: httpx.Client) -> None:
    line = json.dumps(chat_line(1)).encode()[:-1] + b', "extra": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    data = jsonl([chat_line(0)]) + line + b"\n"
    f = client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": "batch"}).json()
    r = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["status"] == "failed"
    [err] = batch["errors"]["data"]
    assert err["line"] == 2 and err["code"] == "invalid_json_line" and "deeper than" in err["message"]
    # the key's one concurrent-job slot is free again: a good batch is accepted
    f = client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(jsonl([chat_line(0)])))},
                    data={"purpose": "batch"}).json()
    r = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"})
    assert r.status_code == 200, r.text
    wait_for(lambda: client.get(f"/v1/batches/{r.json()['id']}").json()["status"] == "completed", 60)


def test_a_job_left_validating_is_failed_by_the_sweeper(server: Threaded, client: httpx.Client) -> None:
    # a process that died while reading a job's input leaves it `validating`: made here as it would be left
    job_id = server.state.batch.jobs.create(key_id=None, shape="openai", endpoint="/v1/chat/completions",
                                            window_s=3600, window="24h", input_file_id=None, meta=None)
    f = client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(jsonl([chat_line(0)])))},
                    data={"purpose": "batch"}).json()
    new = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    refused = client.post("/v1/batches", json=new)  # it holds the key's one slot meanwhile
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "concurrent_jobs_limit"

    def swept() -> dict[str, object] | None:
        body: dict[str, object] = client.get(f"/v1/batches/{job_id}").json()
        return body if body["status"] == "failed" else None

    job = wait_for(swept, 30, message="the sweeper to fail the job")
    [err] = job["errors"]["data"]  # type: ignore[index]
    assert err["code"] == "validation_timeout" and "1 seconds" in err["message"]
    r = client.post("/v1/batches", json=new)
    assert r.status_code == 200, r.text
    wait_for(lambda: client.get(f"/v1/batches/{r.json()['id']}").json()["status"] == "completed", 60)
