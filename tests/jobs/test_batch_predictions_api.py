"""`/v1/batch-predictions` over a real socket: JSON list and JSONL, bad lines, progress and ETA, results and
the download, cancel, the statuses, and refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sluicegate.config import Config, JobsConfig
from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server
from tests.jobs.helpers import poll_seed

BASE = "/v1/batch-predictions"


def pred(i: int, n: int = 3, **opts: Any) -> dict[str, Any]:
    return {"input": {"prompt": f"item {i}"}, "options": {"max_new_tokens": n, "temperature": 0, **opts}}


@pytest.fixture(scope="module")
def server() -> Iterator[Threaded]:
    config = Config(jobs=JobsConfig(poll_s=0.05))
    with threaded_server(config, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4)) as srv:
        yield srv


@pytest.fixture
def client(server: Threaded) -> Iterator[httpx.Client]:
    server.runner.delay_s = 0.0
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_a_json_list_runs_to_succeeded_with_paginated_results_and_a_download(client: httpx.Client) -> None:
    r = client.post(BASE, json=[pred(i) for i in range(5)])
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "queued" and body["poll_url"] == f"{BASE}/{body['id']}"
    assert r.headers["location"] == body["poll_url"]
    done = poll_seed(client, body["id"])
    assert done["status"] == "succeeded"
    assert done["progress"] == {"done": 5, "total": 5, "failed": 0} and done["eta_seconds"] is None
    assert done["finished_at"] is not None

    page1 = client.get(f"{BASE}/{body['id']}/results", params={"limit": 2}).json()
    assert [x["line"] for x in page1["data"]] == [1, 2] and page1["has_more"] and page1["next_after"] == 2
    page3 = client.get(f"{BASE}/{body['id']}/results", params={"limit": 2, "after": 4}).json()
    assert [x["line"] for x in page3["data"]] == [5] and not page3["has_more"] and page3["next_after"] is None
    first = page1["data"][0]
    assert first["status"] == "succeeded" and first["result"]["object"] == "prediction"
    assert first["result"]["usage"]["output_tokens"] >= 1

    dl = client.get(f"{BASE}/{body['id']}/results.jsonl")
    assert dl.status_code == 200 and dl.headers["content-type"].startswith("application/jsonl")
    lines = [json.loads(x) for x in dl.text.splitlines()]
    assert [x["line"] for x in lines] == [1, 2, 3, 4, 5] and all(x["status"] == "succeeded" for x in lines)
    assert body["id"] in [j["id"] for j in client.get(BASE).json()["data"]]


def test_jsonl_keeps_going_past_bad_lines_each_with_its_error_record(client: httpx.Client) -> None:
    lines = [json.dumps(pred(0)), "{not json", json.dumps({"input": {}}), json.dumps(pred(3, n=0)),
             "", json.dumps(pred(5))]
    r = client.post(BASE, content="\n".join(lines) + "\n", headers={"content-type": "application/jsonl"})
    assert r.status_code == 202, r.text
    done = poll_seed(client, r.json()["id"])
    assert done["status"] == "succeeded" and done["progress"] == {"done": 5, "total": 5, "failed": 3}
    results = {x["line"]: x for x in client.get(f"{BASE}/{done['id']}/results").json()["data"]}
    assert set(results) == {1, 2, 3, 4, 6}
    assert results[1]["status"] == results[6]["status"] == "succeeded"
    assert results[2]["error"] == {"line": 2, "code": "invalid_json_line", "message": "this line is not valid JSON"}
    assert results[3]["error"]["line"] == 3 and results[3]["error"]["code"] == "invalid_combination"
    assert results[4]["error"]["code"] == "out_of_range" and "max_new_tokens" in results[4]["error"]["message"]


def test_a_job_whose_every_item_failed_is_failed(client: httpx.Client) -> None:
    r = client.post(BASE, json=[{"input": {"prompt": "x"}, "options": {"nope": 1}}, 5])
    done = poll_seed(client, r.json()["id"])
    assert done["status"] == "failed" and done["progress"]["failed"] == 2


def test_progress_and_eta_while_running_then_cancel_aborts_the_rest(server: Threaded, client: httpx.Client) -> None:
    server.runner.delay_s = 0.02  # a step takes 20 ms: 40 tokens an item keeps items running for a while
    r = client.post(BASE, json=[pred(i, n=40) for i in range(30)])
    job = r.json()["id"]

    def running() -> dict[str, Any] | None:
        b: dict[str, Any] = client.get(f"{BASE}/{job}").json()
        return b if b["status"] == "running" and b["progress"]["done"] >= 1 else None

    mid = wait_for(running, message="some items to finish")
    assert mid["eta_seconds"] is not None and mid["eta_seconds"] > 0, json.dumps(mid)
    assert 1 <= mid["progress"]["done"] < 30
    cancelled = client.delete(f"{BASE}/{job}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    final = poll_seed(client, job)
    assert final["status"] == "cancelled" and final["progress"]["done"] == 30
    statuses = [x["status"] for x in client.get(f"{BASE}/{job}/results", params={"limit": 100}).json()["data"]]
    assert statuses.count("cancelled") >= 10 and "pending" not in statuses
    # nothing of the job is left in the engine
    wait_for(lambda: server.state.runtime.engine is not None and not server.state.runtime.engine.scheduler.has_work,
             message="the engine to be idle")


def test_refusals(client: httpx.Client) -> None:
    r = client.post(BASE, content=b"hello", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["type"] == "unsupported_media_type"
    r = client.post(BASE, json={"input": {"prompt": "x"}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "wrong_type"
    r = client.post(BASE, content=b"[1,", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_json"
    for path in (f"{BASE}/batch_nope", f"{BASE}/batch_nope/results", f"{BASE}/batch_nope/results.jsonl"):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert client.delete(f"{BASE}/batch_nope").status_code == 404
