"""Deadlines over a real socket on the reference backend: the caller's budget from each header, the server's
default and cap, malformed values, expiry while queued (no compute spent) and mid-generation (the envelope,
never a finish reason), and admission by the forecast (503 with Retry-After; the never-fits 4xx).

Every engine step sleeps `DELAY`, a lower bound on every duration here; no test asserts an upper bound on
time. Tests wait on conditions (the engine's counters and queues, the clock passing a deadline)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import EOS_ID
from sluicegate.config import Config, DeadlineConfig
from sluicegate.engine import Engine, EngineRequest, SchedulerConfig
from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server

DELAY = 0.01  # seconds every engine step takes at least
NO_EOS = {str(EOS_ID): -100}  # a run that goes on to its max_tokens
NO_ADMISSION = Config(engine=SchedulerConfig(deadline_admission=False))


class HeldRunner(SlowRunner):
    """Every step takes at least DELAY; from step `hold_after` on, steps wait for `go`."""

    def __init__(self, n_slots: int = 4) -> None:
        super().__init__(delay_s=DELAY, n_ctx=2048, n_slots=n_slots, eos_slope=0.0)  # type: ignore[arg-type]
        self.calls = 0
        self.hold_after: int | None = None
        self.go = threading.Event()

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        self.calls += 1
        if self.hold_after is not None and self.calls > self.hold_after:
            self.go.wait(120)
        return super().execute(batch)


def engine_of(s: Threaded) -> Engine:
    assert s.state.runtime.engine is not None
    return s.state.runtime.engine


def record_submits(eng: Engine) -> list[EngineRequest]:
    """Every request the engine is asked to take (refused ones too), as the serving core built it."""
    seen: list[EngineRequest] = []
    submit = eng.submit

    def recording(request: EngineRequest, sink: Any) -> None:
        seen.append(request)
        submit(request, sink)

    eng.submit = recording  # type: ignore[method-assign]
    return seen


@contextmanager
def served(config: Config = NO_ADMISSION, n_slots: int = 4) -> Iterator[tuple[Threaded, HeldRunner, Engine]]:
    with threaded_server(config, runner=lambda: HeldRunner(n_slots)) as s:
        assert isinstance(s.runner, HeldRunner)
        yield s, s.runner, engine_of(s)


def events(lines: Iterator[str]) -> list[str]:
    return [x for x in lines if x]


def error_of(evts: list[str]) -> dict[str, Any]:
    i = evts.index("event: error")
    return dict(json.loads(evts[i + 1][len("data: "):])["error"])


# -- the caller's budget -----------------------------------------------------------------------------------

BUDGETS = Config(engine=SchedulerConfig(deadline_admission=False),
                 deadlines=DeadlineConfig(default_timeout_s=300.0, max_timeout_s=600.0))
CASES = [  # headers, streamed, the deadline's budget, the first token's budget
    ({"X-Request-Timeout": "40"}, False, 40.0, None),
    ({"X-Request-Timeout": "40"}, True, 40.0, None),  # a total budget bounds a stream to its end
    ({"x-stainless-read-timeout": "40.0"}, False, 40.0, None),  # the Python SDK: a whole answer ...
    ({"x-stainless-read-timeout": "40.0"}, True, 300.0, 40.0),  # ... but only a stream's first token
    ({"x-stainless-timeout": "40"}, False, 40.0, None),  # the Node SDK, the same
    ({"x-stainless-timeout": "40"}, True, 300.0, 40.0),
    ({"X-Request-Timeout": "2.5", "x-stainless-read-timeout": "600.0"}, True, 2.5, None),  # ours wins
    ({}, False, 300.0, None),  # the server's default
    ({"X-Request-Timeout": "86400"}, False, 600.0, None),  # capped by the server's maximum
    ({"x-stainless-read-timeout": "86400"}, True, 300.0, 600.0),
]


def test_each_header_sets_the_deadlines_the_engine_gets() -> None:
    with served(BUDGETS) as (s, _, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = record_submits(eng)
        for headers, stream, budget, first in CASES:
            body = {"model": "reference", "prompt": "Hi", "max_tokens": 2, "stream": stream}
            routes = [("/v1/completions", body)]
            if not stream:
                routes.append(("/v1/generate", {"prompt": "Hi", "max_new_tokens": 2}))
            for path, b in routes:
                seen.clear()
                r = http.post(path, json=b, headers=headers)
                assert r.status_code == 200, (headers, path, r.text)
                (req,) = seen
                assert req.deadline is not None and req.deadline - req.arrival == pytest.approx(budget), headers
                got = None if req.first_token_deadline is None else req.first_token_deadline - req.arrival
                assert got == (None if first is None else pytest.approx(first)), headers


@pytest.mark.parametrize(("headers", "param"), [
    ({"X-Request-Timeout": "soon"}, "X-Request-Timeout"),
    ({"X-Request-Timeout": "0"}, "X-Request-Timeout"),
    ({"X-Request-Timeout": "-3"}, "X-Request-Timeout"),
    ({"x-stainless-read-timeout": "NaN"}, "x-stainless-read-timeout"),
    ({"x-stainless-timeout": "1e999"}, "x-stainless-timeout"),
])
def test_a_malformed_value_is_a_4xx_naming_the_header(headers: dict[str, str], param: str) -> None:
    with served() as (s, _, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = record_submits(eng)
        native = http.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 2}, headers=headers)
        assert native.status_code == 422
        err = native.json()["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request", "invalid_header", param)
        assert err["request_id"] == native.headers["x-request-id"]
        for path, body in (("/v1/completions", {"model": "reference", "prompt": "Hi", "max_tokens": 2}),
                           ("/v1/chat/completions", {"model": "reference", "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "Hi"}]})):
            r = http.post(path, json=body, headers=headers)
            assert r.status_code == 400, path
            e = r.json()["error"]
            assert (e["type"], e["code"], e["param"]) == ("invalid_request_error", "invalid_header", param)
        assert http.get("/v1/models", headers=headers).status_code == 200  # reads create no work
        assert not seen  # refused before the engine saw anything


# -- expiry ------------------------------------------------------------------------------------------------


def release_after_deadline(runner: HeldRunner, seen: list[EngineRequest]) -> threading.Thread:
    """Let the held engine go on once the (first) request's deadline has passed."""

    def run() -> None:
        wait_for(lambda: bool(seen))
        deadline = seen[0].deadline
        assert deadline is not None
        wait_for(lambda: time.monotonic() >= deadline)
        runner.go.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_stream_cut_mid_generation_ends_with_the_error_event_then_done() -> None:
    with served() as (s, runner, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = record_submits(eng)
        runner.hold_after = runner.calls + 4  # four steps give tokens; the next waits
        releaser = release_after_deadline(runner, seen)
        # greedy: a sampled first token can be part of a UTF-8 character, whose text waits for the rest
        body = {"model": "reference", "prompt": "Hi", "max_tokens": 1500, "stream": True, "logit_bias": NO_EOS,
                "temperature": 0}
        with http.stream("POST", "/v1/completions", json=body, headers={"X-Request-Timeout": "3"}) as r:
            assert r.status_code == 200
            evts = events(r.iter_lines())
        releaser.join()
        assert evts[-1] == "data: [DONE]"
        cut = evts.index("event: error")
        chunks = [json.loads(e[6:]) for e in evts[:cut] if e.startswith("data: {")]
        assert chunks and "".join(c["choices"][0]["text"] for c in chunks)  # tokens came before the deadline
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # never a new finish_reason
        err = error_of(evts)
        assert err["type"] == "deadline_exceeded" and "after" in err["message"]
        assert eng.stats.requests_expired_running == 1 and eng.stats.expired_tokens > 0


def test_a_messages_stream_cut_mid_generation_ends_with_anthropics_error_event_then_message_stop() -> None:
    with served() as (s, runner, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = record_submits(eng)
        runner.hold_after = runner.calls + 4
        releaser = release_after_deadline(runner, seen)
        body = {"model": "reference", "max_tokens": 1500, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": "Hi"}]}
        with http.stream("POST", "/v1/messages", json=body, headers={"X-Request-Timeout": "3"}) as r:
            assert r.status_code == 200
            evts = events(r.iter_lines())
        releaser.join()
        assert evts[-2:] == ["event: message_stop", 'data: {"type": "message_stop"}']
        cut = evts.index("event: error")
        assert evts[:cut:2][:2] == ["event: message_start", "event: content_block_start"]
        assert "event: message_delta" not in evts  # never a stop reason for a message that did not end
        body_ = json.loads(evts[cut + 1][len("data: "):])
        assert body_["type"] == "error" and body_["request_id"] == r.headers["request-id"]
        assert body_["error"]["type"] == "timeout_error" and body_["error"]["code"] == "deadline_exceeded"


def hold_outputs_until_the_end(eng: Engine) -> list[EngineRequest]:
    """Every run's outputs reach the serving layer at once, when it finishes: the event loop sees them as one
    merged delta (text and the end together), as it does when it falls behind the engine."""
    seen: list[EngineRequest] = []
    submit = eng.submit

    def holding(request: EngineRequest, sink: Any) -> None:
        held: list[Any] = []

        def hold(out: Any) -> None:
            held.append(out)
            if out.finished:
                for o in held:
                    sink(o)

        seen.append(request)
        submit(request, hold)

    eng.submit = holding  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_tokens_merged_with_the_deadline_error_are_streamed_before_it(route: str) -> None:
    with served() as (s, runner, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = hold_outputs_until_the_end(eng)
        runner.hold_after = runner.calls + 4
        releaser = release_after_deadline(runner, seen)
        body: dict[str, Any] = {"model": "reference", "max_tokens": 1500, "stream": True, "logit_bias": NO_EOS,
                                "temperature": 0}  # greedy: the tokens' text does not depend on a draw
        chat = {"messages": [{"role": "user", "content": "Hi"}]}
        body.update({"prompt": "Hi"} if route == "/v1/completions" else chat)
        with http.stream("POST", route, json=body, headers={"X-Request-Timeout": "3"}) as r:
            assert r.status_code == 200
            evts = events(r.iter_lines())
        releaser.join()
        assert evts[-1] == "data: [DONE]"
        chunks = [json.loads(e[6:]) for e in evts[:evts.index("event: error")] if e.startswith("data: {")]
        texts = [c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") for c in chunks]
        assert "".join(t for t in texts if t)  # the tokens generated before the deadline were not dropped
        err = error_of(evts)
        assert err["type"] == "deadline_exceeded"
        assert re.search(r"after [1-9]\d* new tokens", err["message"])


def test_a_whole_answer_cut_mid_generation_is_a_504() -> None:
    with served() as (s, runner, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        seen = record_submits(eng)
        runner.hold_after = runner.calls + 1
        releaser = release_after_deadline(runner, seen)
        r = http.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 1500},
                      headers={"x-stainless-read-timeout": "3.0"})
        releaser.join()
        assert r.status_code == 504
        err = r.json()["error"]
        assert err["type"] == "deadline_exceeded" and "after" in err["message"] and "new tokens" in err["message"]
        assert eng.stats.requests_expired_running == 1


def test_a_queued_request_whose_deadline_passes_is_dropped_before_any_compute() -> None:
    with served(n_slots=1) as (s, _, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        body = {"model": "reference", "prompt": "Hi", "max_tokens": 1500, "stream": True, "logit_bias": NO_EOS}
        with http.stream("POST", "/v1/completions", json=body) as blocker:  # holds the only slot for >= 15 s
            lines = blocker.iter_lines()
            next(lines)
            wait_for(lambda: eng.stats.running == 1)
            prompt_before, steps_before = eng.stats.prompt_tokens, eng.stats.steps
            r = http.post("/v1/generate", json={"prompt": "a longer prompt, never computed", "max_new_tokens": 4},
                          headers={"X-Request-Timeout": "0.5"})
            assert r.status_code == 504
            assert "before it started" in r.json()["error"]["message"]
            assert eng.stats.prompt_tokens == prompt_before  # its prompt was never computed
            assert eng.stats.steps > steps_before  # while the blocker went on
        snap = eng.stats.snapshot()
        assert (snap["requests_expired_queued"], snap["requests_expired_running"], snap["expired_tokens"]) == (1, 0, 0)
        m = parse_metrics(http.get("/metrics").text)
        assert m['sluicegate_requests_expired_total{stage="queued"}'] == 1
        assert m['sluicegate_requests_expired_total{stage="running"}'] == 0


# -- admission by the forecast -----------------------------------------------------------------------------


SERVER_DEFAULT = Config(deadlines=DeadlineConfig(default_timeout_s=0.3, max_timeout_s=600.0))


def test_the_forecast_is_calibrated_before_ready_and_judges_the_first_request() -> None:
    with served(SERVER_DEFAULT) as (s, _, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        cal = eng.speed.calibration
        assert cal is not None and cal.step_1 >= DELAY  # measured on the runner before /readyz said ready
        # 1000 tokens take >= 10 s (every step sleeps 10 ms): refused up front, not admitted to expire
        body = {"model": "reference", "prompt": "Hi", "max_tokens": 1000, "logit_bias": NO_EOS}
        r = http.post("/v1/completions", json=body, headers={"X-Request-Timeout": "0.3"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "deadline_too_short"
        assert eng.stats.requests_expired == 0 and eng.stats.requests_finished == 0
        # the same without a header: the server's default (0.3 s) ends it, but no forecast refuses it
        d = http.post("/v1/completions", json=body)
        assert d.status_code == 504, d.text
        assert eng.stats.requests_shed == 0 and eng.stats.requests_expired == 1


def test_shedding_and_the_never_fits_4xx_once_the_speed_is_measured() -> None:
    with served(Config(), n_slots=1) as (s, _, eng), httpx.Client(base_url=s.url, timeout=120) as http:
        # >= 1.5 s of steps: the end-of-text token is forbidden, or a sampled one ends the run early (the
        # reference model samples it now and then), before the forecast has measured enough work
        warm = http.post("/v1/completions", json={"model": "reference", "prompt": "Hi", "max_tokens": 150,
                                                  "logit_bias": NO_EOS})
        assert warm.status_code == 200 and warm.json()["usage"]["completion_tokens"] == 150
        # never fits: 1000 new tokens take >= 10 s even idle (every step sleeps 10 ms)
        r = http.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 1000},
                      headers={"X-Request-Timeout": "2.5"})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["type"], err["param"], err["code"]) == ("deadline_too_short", "max_new_tokens", "answer")
        assert "2.5 s (X-Request-Timeout)" in err["message"]
        o = http.post("/v1/completions", json={"model": "reference", "prompt": "Hi", "max_tokens": 1000},
                      headers={"X-Request-Timeout": "2.5"})
        assert o.status_code == 400
        e = o.json()["error"]
        assert (e["type"], e["code"], e["param"]) == ("invalid_request_error", "deadline_too_short", "max_tokens")
        # a stream bounded on its first token by an SDK read timeout: no step is that short
        f = http.post("/v1/completions", json={"model": "reference", "prompt": "Hi", "max_tokens": 4,
                                               "stream": True}, headers={"x-stainless-read-timeout": "0.005"})
        assert f.status_code == 400
        e = f.json()["error"]
        assert (e["code"], e["param"]) == ("deadline_too_short", "x-stainless-read-timeout")
        assert "first token" in e["message"]

        body = {"model": "reference", "prompt": "Hi", "max_tokens": 1800, "stream": True, "logit_bias": NO_EOS}
        with http.stream("POST", "/v1/completions", json=body) as blocker:  # the only slot, >= 18 s of work
            lines = blocker.iter_lines()
            next(lines)
            wait_for(lambda: eng.stats.running == 1)
            cal = eng.speed.calibration
            assert cal is not None
            budget = 10 * (cal.step_1 + 3 * cal.token_s)  # ten times one new token after a short prompt, idle
            assert 1000 * cal.step_1 > 3 * budget  # the blocker's work left is far over the budget
            finished = eng.stats.requests_finished
            for path, b in (("/v1/generate", {"prompt": "Hi", "max_new_tokens": 1}),
                            ("/v1/completions", {"model": "reference", "prompt": "Hi", "max_tokens": 1})):
                shed = http.post(path, json=b, headers={"X-Request-Timeout": f"{budget:.4f}"})
                assert shed.status_code == 503, shed.text
                e = shed.json()["error"]
                assert (e["type"], e["code"]) == ("overloaded", "wait_exceeds_deadline")
                assert 1 <= int(shed.headers["retry-after"]) <= 60
            assert eng.stats.requests_shed == 2 and eng.stats.requests_finished == finished  # never queued
            assert eng.stats.waiting == 0
        m = parse_metrics(http.get("/metrics").text)
        assert m["sluicegate_requests_shed_total"] == 2
        assert m["sluicegate_requests_in_deadline_total"] >= 1 and m["sluicegate_goodput_tokens_total"] >= 150
        assert m["sluicegate_drain_tokens_per_second"] > 0
        assert m["sluicegate_forecast_error_ratio_count"] >= 1  # the warm-up's forecast, against its latency
        assert m['sluicegate_request_errors_total{type="deadline_too_short"}'] >= 2


def test_after_a_wrong_estimate_the_server_admits_again_within_seconds() -> None:
    """Steps 8x slower for one long run teach the forecast that the engine is slow; then the engine is fast again,
    and a refusing engine measures nothing. The estimate decays back to the calibration: a client that honours
    Retry-After is admitted after a few seconds' worth of it (an estimate that only moved while the engine
    worked stayed wrong for good)."""
    with served(Config(), n_slots=1) as (s, runner, _), httpx.Client(base_url=s.url, timeout=120) as http:
        runner.delay_s = 8 * DELAY
        slow = http.post("/v1/completions", json={"model": "reference", "prompt": "Hi", "max_tokens": 60,
                                                  "logit_bias": NO_EOS})
        assert slow.status_code == 200
        runner.delay_s = DELAY
        # 100 tokens: ~1 s at the calibration, ~4 s at the wrong estimate; 3 s allowed
        body = {"model": "reference", "prompt": "Hi", "max_tokens": 100, "logit_bias": NO_EOS}
        asked: list[int] = []
        while sum(asked) <= 10:
            r = http.post("/v1/completions", json=body, headers={"X-Request-Timeout": "3"})
            if r.status_code != 503:
                break
            assert r.json()["error"]["code"] == "wait_exceeds_deadline"
            asked.append(int(r.headers["retry-after"]))
            time.sleep(asked[-1])  # as the SDKs do
        assert r.status_code == 200, r.text
        assert sum(asked) <= 10, asked
