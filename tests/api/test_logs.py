"""`--log-format json`: every line the server writes is one JSON object, and every line a request causes carries
its request id (the access line included); no line carries the key or the prompt."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx

from sluicegate.telemetry.logs import REQUEST_ID, JsonFormatter
from sluicegate.testing.refserver import running

PROMPT = "a prompt that must never reach a log line"


def test_a_server_logging_json_writes_only_json_and_every_request_line_has_its_id(tmp_path: Path) -> None:
    with running(tmp_path, "--log-format", "json", "--log-level", "info") as server:
        r = httpx.post(f"{server.url}/v1/generate", json={"prompt": PROMPT, "max_new_tokens": 2},
                       headers={"X-Request-Id": "req-log-1", "Authorization": "Bearer sk-secret-never-logged"},
                       timeout=60)
        assert r.status_code == 200
        bad = httpx.post(f"{server.url}/v1/generate", json={"prompt": PROMPT, "max_new_tokens": 0},
                         headers={"X-Request-Id": "req-log-2"}, timeout=60)
        assert bad.status_code == 422
        body = {"model": "reference", "prompt": PROMPT, "max_tokens": 3, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers={"X-Request-Id": "req-log-3"},
                          timeout=60) as streamed:
            assert streamed.status_code == 200
            streamed.read()
    text = server.log()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line parses
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    access = {}
    for rid in ("req-log-1", "req-log-2", "req-log-3"):
        mine = [line for line in lines if line.get("request_id") == rid]
        found = [line for line in mine if line["logger"] == "sluicegate.access"]
        assert len(found) == 1, rid
        access[rid] = found[0]
    one = access["req-log-1"]
    assert (one["route"], one["method"], one["status"], one["key_id"]) == ("/v1/generate", "POST", 200, None)
    assert one["prompt_tokens"] > 0 and one["completion_tokens"] == 2 and one["cached_tokens"] >= 0
    assert one["finish_reason"] in ("length", "stop") and one["duration_ms"] > 0
    assert {"queue_ms", "prefill_ms", "decode_ms"} <= one.keys()
    refused = access["req-log-2"]
    assert refused["status"] == 422 and refused["completion_tokens"] == 0 and "finish_reason" not in refused
    streamed_line = access["req-log-3"]
    assert streamed_line["route"] == "/v1/completions" and streamed_line["completion_tokens"] > 0
    assert "decode_ms" in streamed_line and streamed_line["finish_reason"] in ("length", "stop")
    assert PROMPT not in text and "sk-secret-never-logged" not in text
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # uvicorn's own lines, in the same format


def test_the_formatter_keeps_fields_and_the_traceback() -> None:
    fmt = JsonFormatter()
    token = REQUEST_ID.set("req_ctx")
    try:
        record = logging.LogRecord("sluicegate.access", logging.INFO, __file__, 1, "%s done", ("x",), None)
        record.fields = {"status": 200, "route": "/v1/generate"}
        out = json.loads(fmt.format(record))
    finally:
        REQUEST_ID.reset(token)
    assert out["message"] == "x done" and out["request_id"] == "req_ctx" and out["status"] == 200
    assert out["time"].endswith("Z") and out["level"] == "info"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = json.loads(fmt.format(record))
    assert "ValueError: boom" in out["exception"] and "request_id" not in out
