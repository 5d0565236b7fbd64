"""SIGTERM: the server stops taking work, finishes what is in flight, and exits cleanly."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.testing.wait import wait_for
from tests.e2e.conftest import start_server


def test_sigterm_finishes_in_flight_work_then_exits(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--drain-seconds", "120")  # an upper bound: it exits when done
    result: dict[str, object] = {}

    def long_request() -> None:
        r = httpx.post(f"{srv.url}/v1/generate", timeout=120, json={
            "prompt": "Tell me a long story.", "max_new_tokens": 96, "temperature": 1.0, "seed": 3,
        })
        result["status"] = r.status_code
        result["body"] = r.json()

    worker = threading.Thread(target=long_request)
    worker.start()
    # wait until the request is in the engine, generating: in flight, it has produced a token
    wait_for(lambda: parse_metrics(httpx.get(f"{srv.url}/metrics", timeout=10).text)
             .get("sluicegate_generated_tokens_total", 0) > 0, 60, interval=0.05, message="a token generated")
    srv.proc.send_signal(signal.SIGTERM)
    worker.join(timeout=60)
    rc = srv.proc.wait(timeout=60)
    assert result["status"] == 200
    body = result["body"]
    assert isinstance(body, dict)
    assert body["finish_reason"] in ("length", "eos")
    assert body["usage"]["completion_tokens"] == len(body["token_ids"])
    assert rc == 0, srv.log()  # the drain ends the process itself (docs/connections.md)
    log = srv.log()
    assert "Application shutdown complete" in log
    assert "Traceback" not in log
