"""Shared pieces of the batch tests: JSONL inputs, polling a job to an end (on events, not sleeps)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

FINAL_OPENAI = {"completed", "failed", "expired", "cancelled"}
FINAL_SEED = {"succeeded", "failed", "cancelled"}


def chat_line(i: int, *, max_tokens: int = 4, url: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    body = {"model": "reference", "messages": [{"role": "user", "content": f"item {i}"}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


def jsonl(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def wait_for(check: Callable[[], Any], timeout: float = 120.0, what: str = "the condition") -> Any:
    """Poll `check` until it returns something truthy (the server's state is the event; bounded generously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def poll_seed(client: httpx.Client, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/batch-predictions/{job_id}").json()
        return body if body["status"] in FINAL_SEED else None

    return dict(wait_for(done, timeout, f"job {job_id} to finish"))
