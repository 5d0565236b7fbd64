"""Shared pieces of the batch tests: JSONL inputs, polling a job to an end (on events, not sleeps)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from sluicegate.testing.wait import wait_for

FINAL_OPENAI = {"completed", "failed", "expired", "cancelled"}
FINAL_SEED = {"succeeded", "failed", "cancelled"}


def chat_line(i: int, *, max_tokens: int = 4, url: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    body = {"model": "reference", "messages": [{"role": "user", "content": f"item {i}"}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


def jsonl(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def poll_seed(client: httpx.Client, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/batch-predictions/{job_id}").json()
        return body if body["status"] in FINAL_SEED else None

    return dict(wait_for(done, timeout, message=f"job {job_id} to finish"))
