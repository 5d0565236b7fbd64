"""Helpers of the crash and replica tests: a job submitted over HTTP, its items read from the shared store."""

from __future__ import annotations

import io
import json
import signal
from dataclasses import dataclass

import httpx
from sqlalchemy import select

from sluicegate.store.db import Store
from sluicegate.store.models import BatchItem
from sluicegate.testing.refserver import RefServer
from tests.jobs.helpers import jsonl

# each item generates 20 tokens at 30 ms a step: long enough that a kill lands mid-job
SLOW = ["--step-delay-ms", "30", "--eos-slope", "0", "--slots", "8", "--batch-lease-seconds", "2",
        "--batch-poll-seconds", "0.1"]


def submit(url: str, n: int, max_tokens: int = 20) -> str:
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": "reference", "prompt": f"item {i}", "max_tokens": max_tokens, "temperature": 0}}
            for i in range(n)]
    with httpx.Client(base_url=url, timeout=30) as c:
        f = c.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(jsonl(rows)))}, data={"purpose": "batch"})
        f.raise_for_status()
        b = c.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                        "completion_window": "24h"})
        b.raise_for_status()
        return str(b.json()["id"])


@dataclass
class ItemRow:
    custom_id: str
    state: str
    owner: str | None
    attempts: int
    result_writes: int
    finished_by: str | None


def items(admin: Store, job_id: str) -> list[ItemRow]:
    with admin.session() as s:
        rows = s.execute(select(BatchItem.custom_id, BatchItem.state, BatchItem.owner, BatchItem.attempts,
                                BatchItem.result_writes, BatchItem.finished_by)
                         .where(BatchItem.job_id == job_id)).all()
    return [ItemRow(*r) for r in rows]


def done_count(admin: Store, job_id: str) -> int:
    return sum(r.state == "done" for r in items(admin, job_id))


def kill9(server: RefServer) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=30)


def output_ids(url: str, batch_id: str) -> list[str]:
    with httpx.Client(base_url=url, timeout=30) as c:
        batch = c.get(f"/v1/batches/{batch_id}").json()
        assert batch["status"] == "completed", batch
        text = c.get(f"/v1/files/{batch['output_file_id']}/content").text
    return [json.loads(line)["custom_id"] for line in text.splitlines()]
