"""A dropped 1,500-token request stops generating at once, and the next request is not held up by it.

The server has ONE slot: had the dropped request kept generating, the next request would wait for the
rest of its 1,500 tokens (many seconds). The engine's own counters (/metrics) show the stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.testing.wait import wait_for
from tests.e2e.conftest import Server, start_server, stop_server

LONG: dict[str, object] = {
    "prompt": "Count slowly from one to two thousand, one number per line:\n1\n2\n3\n",
    "max_tokens": 1500,
    "temperature": 0.0,
    "logit_bias": {"0": -100, "2": -100},  # no end-of-text: it would run all 1,500 tokens
}


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("one-slot"), "--slots", "1")
    LONG["model"] = httpx.get(f"{srv.url}/v1/models", timeout=10).json()["data"][0]["id"]
    yield srv
    stop_server(srv)


def metrics(server: Server) -> dict[str, float]:
    m = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
    out = {k.removeprefix("sluicegate_").replace("_total", ""): v for k, v in m.items()}
    out["requests_cancelled"] = out.get('requests_finished{finish_reason="cancelled"}', 0.0)
    return out


def drop_stream(server: Server) -> int:
    """Start a streaming completion, read a few tokens' events, hang up; return the events read."""
    events = 0
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += 1
            if events >= 5:
                break
    return events


def drop_plain(server: Server) -> int:
    """Send a non-streaming completion and hang up after a second, before it can finish."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=httpx.Timeout(60, read=1.0))
    return 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("drop", [drop_stream, drop_plain], ids=["streaming", "non-streaming"])
def test_a_dropped_long_request_stops_and_the_next_is_not_delayed(
    one_slot: Server, drop: Callable[[Server], int]
) -> None:
    before = metrics(one_slot)
    drop(one_slot)
    # right after the hang-up, on the same single slot
    t = time.perf_counter()
    short = {"prompt": "Hi", "max_new_tokens": 8, "temperature": 0.0}
    r = httpx.post(f"{one_slot.url}/v1/generate", json=short, timeout=120)
    latency = time.perf_counter() - t
    assert r.status_code == 200, r.text
    body = r.json()
    wait_for(lambda: metrics(one_slot)["requests_cancelled"] == before["requests_cancelled"] + 1)
    after = metrics(one_slot)
    # had the dropped request kept its slot, the follow-up would have queued for ~1,500 engine steps; it
    # queued for a few (the step in flight when the hang-up was noticed, then its own admission). Bounds
    # scale with the measured step time, so a loaded machine does not fail the test.
    step_ms = 1000 * after["step_seconds_sum"] / max(1.0, after["step_seconds_count"])
    assert body["timing"]["queue_ms"] < max(2000.0, 10 * step_ms), (body["timing"], step_ms, latency)
    assert after["running"] == 0 and after["waiting"] == 0 and after["slots_busy"] == 0
    generated = after["generated_tokens"] - before["generated_tokens"]
    dropped_tokens = generated - body["usage"]["completion_tokens"]
    assert 0 < dropped_tokens < 300, dropped_tokens  # it stopped long before 1,500
    time.sleep(1.0)
    assert metrics(one_slot)["generated_tokens"] == after["generated_tokens"]  # and stays stopped


def test_cancelled_work_leaves_the_slot_reusable(one_slot: Server) -> None:
    drop_stream(one_slot)
    r = httpx.post(f"{one_slot.url}/v1/completions", json={**LONG, "max_tokens": 16}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
