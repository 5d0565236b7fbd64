"""Batch jobs where the server serves a model through an upstream (real processes, real sockets: the upstream is
another sluicegate on the reference backend, as in tests/api/test_upstream_sluicegate.py):

- with no local model (`--no-local-model --upstream NAME=URL`) both job shapes run to their end;
- beside a local model, each item goes to the model it names: the local one, the upstream's, or a 404
  model_not_found for a model nobody serves (that item alone fails).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.testing.refserver import RefServer, running
from sluicegate.testing.wait import wait_for
from tests.jobs.helpers import chat_line, jsonl, poll_seed

FAST = ("--eos-slope", "0", "--batch-poll-seconds", "0.1")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RefServer, RefServer, RefServer]]:
    """(the upstream serving `big`, a front with no local model, a front serving `reference` locally and `big`)."""
    logs: Path = tmp_path_factory.mktemp("logs")
    with running(logs, *FAST, "--name", "big") as up, \
            running(logs, *FAST, "--no-local-model", "--upstream", f"big={up.url}/v1", timeout=60.0) as only, \
            running(logs, *FAST, "--upstream", f"big={up.url}/v1", timeout=60.0) as both:
        yield up, only, both


def run_openai_batch(url: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as c:
        f = c.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(jsonl(rows)))}, data={"purpose": "batch"})
        assert f.status_code == 200, f.text
        r = c.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions",
                                        "completion_window": "24h"})
        assert r.status_code == 200, r.text
        batch: dict[str, Any] = wait_for(
            lambda: (b := c.get(f"/v1/batches/{r.json()['id']}").json())["status"] in ("completed", "failed") and b,
            90, message="the batch to end")
        lines: dict[str, Any] = {}
        for fid in (batch["output_file_id"], batch["error_file_id"]):
            if fid:
                for line in c.get(f"/v1/files/{fid}/content").text.splitlines():
                    obj = json.loads(line)
                    lines[obj["custom_id"]] = obj
        batch["lines"] = lines
        return batch


def test_with_no_local_model_both_job_shapes_run(servers: tuple[RefServer, RefServer, RefServer]) -> None:
    _, only, _ = servers
    batch = run_openai_batch(only.url, [chat_line(i, model="big") for i in range(3)])
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert {x["response"]["body"]["model"] for x in batch["lines"].values()} == {"big@upstream"}
    with httpx.Client(base_url=only.url, timeout=60) as c:
        r = c.post("/v1/batch-predictions", json=[{"input": {"prompt": f"p{i}"}, "options": {"max_new_tokens": 2}}
                                                  for i in range(2)])
        assert r.status_code == 202, r.text
        done = poll_seed(c, r.json()["id"], 90)
    assert done["status"] == "succeeded" and done["progress"]["done"] == 2 and done["progress"]["failed"] == 0


def test_each_item_goes_to_the_model_it_names(servers: tuple[RefServer, RefServer, RefServer]) -> None:
    _, _, both = servers
    rows = [chat_line(0, model="big"), chat_line(1, model="reference"), chat_line(2, model="nobody")]
    batch = run_openai_batch(both.url, rows)
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    lines = batch["lines"]
    assert lines["req-0"]["response"]["body"]["model"] == "big@upstream"
    assert lines["req-1"]["response"]["body"]["model"] == "reference@seed0"
    missing = lines["req-2"]["response"]
    assert missing["status_code"] == 404 and missing["body"]["error"]["code"] == "model_not_found"
