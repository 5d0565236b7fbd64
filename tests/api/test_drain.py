"""The drain on SIGTERM, against the reference server as a subprocess: /readyz turns 503, new requests get 503
`shutting_down` with Retry-After while the listener still answers, running streams end with an error event and
`[DONE]` once the drain time is over, a whole answer gets its envelope, one log line per cut request, exit 0;
a second signal exits at once."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import pytest

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.backends.reference import EOS_ID
from sluicegate.testing.refserver import RefServer, running
from sluicegate.testing.wait import wait_for
from tests.api.rawhttp import Reader, connect, exchange, request

pytestmark = pytest.mark.timeout(180)

SLOW = ("--step-delay-ms", "20", "--eos-slope", "0", "--log-level", "info")
NO_EOS = {str(EOS_ID): -100}  # every run goes on to its max_tokens


def completion(stream: bool, request_id: str) -> bytes:
    body = json.dumps({"model": "reference", "prompt": "Hi", "max_tokens": 450, "stream": stream,
                       "logit_bias": NO_EOS}).encode()
    return request("POST", "/v1/completions", "Content-Type: application/json", f"X-Request-Id: {request_id}",
                   body=body)


def open_stream(port: int, request_id: str) -> tuple[socket.socket, Reader]:
    """A streaming completion, read until its first event has arrived (it is running in the engine)."""
    s = connect(port)
    s.sendall(completion(True, request_id))
    r = Reader(s)
    while b"data: " not in r.buf:
        assert r._more(), "the stream closed before its first event"
    return s, r


def wait_running(server: RefServer, n: int) -> None:
    wait_for(lambda: parse_metrics(httpx.get(f"{server.url}/metrics").text).get("sluicegate_running") == n, 60,
             message="the requests to all reach the engine")


def wait_readyz(server: RefServer, status: int) -> httpx.Response:
    def answered() -> httpx.Response | None:
        resp = httpx.get(f"{server.url}/readyz", timeout=30)
        return resp if resp.status_code == status else None

    return wait_for(answered, 60, message=f"/readyz to answer {status}")


def test_sigterm_drains_then_ends_every_stream_with_an_error_event_and_done(tmp_path: Path) -> None:
    with running(tmp_path, *SLOW, "--drain-seconds", "1") as server:
        streams = [open_stream(server.port, f"long-{i}") for i in range(4)]
        whole = connect(server.port)
        whole.sendall(completion(False, "whole-1"))
        wait_running(server, 5)  # the whole answer is in the engine too
        server.proc.send_signal(signal.SIGTERM)

        ready = wait_readyz(server, 503)
        assert ready.status_code == 503 and ready.json()["error"]["type"] == "shutting_down"
        assert httpx.get(f"{server.url}/healthz").status_code == 200  # alive while draining

        refused, closed = exchange(server.port, completion(False, "late-1"))
        assert refused.status == 503 and closed
        assert refused.error["type"] == "shutting_down" and refused.error["request_id"] == "late-1"
        assert int(refused.headers["retry-after"]) > 0

        for s, r in streams:
            with s:
                reply = r.reply()  # the rest of the stream, to its last chunk
            assert reply.status == 200
            events = reply.body.decode().strip().split("\n\n")
            assert events[-1] == "data: [DONE]"
            error = events[-2]
            assert error.startswith("event: error\ndata: ")
            assert json.loads(error.split("data: ", 1)[1])["error"]["type"] == "shutting_down"
        with whole:
            answer = Reader(whole).reply()
        assert answer.status == 503 and answer.error["type"] == "shutting_down"
        assert answer.error["request_id"] == "whole-1"

        assert server.proc.wait(timeout=120) == 0
        log = server.log()
        assert "Traceback" not in log and "CancelledError" not in log
        cut = [line for line in log.splitlines() if "cut by the shutdown" in line]
        assert sorted(line.split()[4] for line in cut) == ["long-0", "long-1", "long-2", "long-3", "whole-1"]


def test_sigterm_with_nothing_in_flight_exits_0(tmp_path: Path) -> None:
    with running(tmp_path, "--log-level", "info") as server:
        assert httpx.get(f"{server.url}/v1/models").status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0
        assert "Traceback" not in server.log()


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    with running(tmp_path, *SLOW, "--drain-seconds", "600") as server:
        s, _ = open_stream(server.port, "held-1")
        with s:
            server.proc.send_signal(signal.SIGTERM)
            assert wait_readyz(server, 503).status_code == 503
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(timeout=120) == 128 + signal.SIGINT
        assert "second SIGINT: exiting now" in server.log()


def test_in_flight_streams_finish_normally_within_the_drain_and_then_the_process_exits(tmp_path: Path) -> None:
    """A long drain time is an upper bound: the process exits as soon as its last stream has ended."""
    with running(tmp_path, *SLOW, "--drain-seconds", "600") as server:
        s = connect(server.port)
        body = json.dumps({"model": "reference", "prompt": "Hi", "max_tokens": 40, "stream": True,
                           "logit_bias": NO_EOS}).encode()
        s.sendall(request("POST", "/v1/completions", "Content-Type: application/json", "X-Request-Id: short-1",
                          body=body))
        r = Reader(s)
        while b"data: " not in r.buf:
            assert r._more()
        server.proc.send_signal(signal.SIGTERM)
        with s:
            reply = r.reply()
        events = reply.body.decode().strip().split("\n\n")
        assert events[-1] == "data: [DONE]"
        assert not any(e.startswith("event: error") for e in events)
        assert json.loads(events[-2].split("data: ", 1)[1])["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(timeout=120) == 0  # long before the 600 s drain time
        assert "cut by the shutdown" not in server.log()
