"""The caller's budget from its headers, and the deadlines it makes (serving/deadline.py)."""

from __future__ import annotations

import pytest

from sluicegate.config import DeadlineConfig
from sluicegate.serving.context import RequestContext
from sluicegate.serving.deadline import DEFAULT_SOURCE, MAX_SOURCE, apply, caller_timeout, deadlines
from sluicegate.serving.errors import ApiError

NO_CAP = DeadlineConfig(default_timeout_s=None, max_timeout_s=None)


@pytest.mark.parametrize(("headers", "seconds", "name", "whole"), [
    ({"x-request-timeout": ["10"]}, 10.0, "X-Request-Timeout", True),
    ({"x-request-timeout": [" 2.5 "]}, 2.5, "X-Request-Timeout", True),
    ({"x-stainless-read-timeout": ["600.0"]}, 600.0, "x-stainless-read-timeout", False),  # the Python SDK
    ({"x-stainless-read-timeout": ["1e-05"]}, 1e-05, "x-stainless-read-timeout", False),  # str() of a tiny float
    ({"x-stainless-timeout": ["60"]}, 60.0, "x-stainless-timeout", False),  # the Node SDK: whole seconds
    ({"x-stainless-timeout": ["0"]}, 1.0, "x-stainless-timeout", False),  # Node, a timeout under one second
    # X-Request-Timeout wins over the SDKs' headers, Python's over Node's
    ({"x-request-timeout": ["5"], "x-stainless-read-timeout": ["600.0"]}, 5.0, "X-Request-Timeout", True),
    ({"x-stainless-timeout": ["9"], "x-stainless-read-timeout": ["7"]}, 7.0, "x-stainless-read-timeout", False),
    ({"x-request-timeout": ["3", "3"]}, 3.0, "X-Request-Timeout", True),  # the same value twice is one value
])
def test_the_callers_budget(headers: dict[str, list[str]], seconds: float, name: str, whole: bool) -> None:
    t = caller_timeout(headers)
    assert t is not None and (t.seconds, t.header, t.whole) == (seconds, name, whole)


def test_no_header_no_budget() -> None:
    assert caller_timeout({}) is None and caller_timeout({"x-request-id": ["abc"]}) is None


@pytest.mark.parametrize(("headers", "param"), [
    ({"x-request-timeout": ["abc"]}, "X-Request-Timeout"),
    ({"x-request-timeout": [""]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["0"]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["-1"]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["nan"]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["inf"]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["1_0"]}, "X-Request-Timeout"),  # float() would take it
    ({"x-request-timeout": ["10s"]}, "X-Request-Timeout"),
    ({"x-request-timeout": ["1e999"]}, "X-Request-Timeout"),  # overflows to infinity
    ({"x-request-timeout": ["3", "4"]}, "X-Request-Timeout"),
    ({"x-stainless-read-timeout": ["0.0"]}, "x-stainless-read-timeout"),
    ({"x-stainless-timeout": ["-5"]}, "x-stainless-timeout"),
    ({"x-request-timeout": ["x"], "x-stainless-read-timeout": ["600.0"]}, "X-Request-Timeout"),
])
def test_a_malformed_value_is_refused_by_name(headers: dict[str, list[str]], param: str) -> None:
    with pytest.raises(ApiError) as err:
        caller_timeout(headers)
    e = err.value
    assert (e.type, e.status, e.param, e.code) == ("invalid_request", 422, param, "invalid_header")
    for values in headers.values():
        assert all(v not in e.message for v in values if len(v) > 1)  # the input is not echoed


def test_a_whole_budget_bounds_streams_too() -> None:
    d = deadlines(caller_timeout({"x-request-timeout": ["10"]}), 100.0, NO_CAP)
    assert d.answer == d.stream and d.answer is not None and d.first_token is None
    assert (d.answer.at, d.answer.budget_s, d.answer.source) == (110.0, 10.0, "X-Request-Timeout")


def test_an_sdk_read_timeout_bounds_a_streams_first_token_only() -> None:
    d = deadlines(caller_timeout({"x-stainless-read-timeout": ["30.0"]}), 100.0, NO_CAP)
    assert d.answer is not None and d.answer.at == 130.0
    assert d.first_token is not None and d.first_token.at == 130.0
    assert d.stream is None  # no default, no cap: after its first token the stream has no deadline
    capped = deadlines(caller_timeout({"x-stainless-read-timeout": ["30.0"]}), 100.0, DeadlineConfig())
    assert capped.stream is not None and capped.stream.source == MAX_SOURCE and capped.stream.budget_s == 1800.0


def test_the_servers_default_and_maximum() -> None:
    d = deadlines(None, 0.0, NO_CAP)
    assert d.answer is None and d.stream is None and d.first_token is None
    default = deadlines(None, 0.0, DeadlineConfig(default_timeout_s=30.0, max_timeout_s=60.0))
    assert default.answer is not None and (default.answer.at, default.answer.source) == (30.0, DEFAULT_SOURCE)
    only_cap = deadlines(None, 0.0, DeadlineConfig())
    assert only_cap.answer is not None and (only_cap.answer.at, only_cap.answer.source) == (1800.0, MAX_SOURCE)
    capped = deadlines(caller_timeout({"x-request-timeout": ["100"]}), 0.0, DeadlineConfig(max_timeout_s=20.0))
    assert capped.answer is not None and (capped.answer.at, capped.answer.budget_s) == (20.0, 20.0)
    assert capped.answer.source == MAX_SOURCE
    under = deadlines(caller_timeout({"x-request-timeout": ["5"]}), 0.0, DeadlineConfig(default_timeout_s=30.0))
    assert under.answer is not None and under.answer.at == 5.0  # a caller may always ask for less


def test_the_context_switches_to_a_streams_deadlines() -> None:
    ctx = RequestContext("r", arrival=50.0)
    apply(ctx, caller_timeout({"x-stainless-read-timeout": ["10"]}), DeadlineConfig(max_timeout_s=300.0))
    assert ctx.deadline == 60.0 and ctx.first_token_deadline is None
    ctx.streaming()
    assert ctx.deadline == 350.0 and ctx.first_token_deadline == 60.0
    plain = RequestContext("p", deadline=7.0)  # set directly (tests, jobs): streaming leaves it alone
    plain.streaming()
    assert plain.deadline == 7.0
