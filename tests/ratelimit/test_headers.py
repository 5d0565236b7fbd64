"""Rendering a limiter's answer over HTTP: the headers, their rounding, the refusal errors."""

from __future__ import annotations

import re

import pytest

from sluicegate.api.ratelimit_errors import refusal_error, unavailable_error
from sluicegate.serving.errors import STATUS
from sluicegate.tenancy.ratelimit import (
    BucketState,
    BucketVerdict,
    Decision,
    go_duration,
    rate_limit_headers,
)
from sluicegate.tenancy.ratelimit.bucket import TokenLimit, decision_of, state_of
from sluicegate.tenancy.ratelimit.headers import ceil_ms, ceil_seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (-1.0, "0s"),
        (1e-12, "0s"),  # float noise is not a wait
        (0.0001, "1ms"),  # any real wait is at least 1 ms
        (0.006, "6ms"),
        (0.0061, "7ms"),  # rounded up, never down
        (0.999, "999ms"),
        (0.9991, "1s"),
        (1.0, "1s"),
        (1.2, "1.2s"),
        (1.25, "1.25s"),
        (59.999, "59.999s"),
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (90.5, "1m30.5s"),
        (360.0, "6m0s"),  # OpenAI's documented example
        (3600.0, "1h0m0s"),
        (3661.0, "1h1m1s"),
        (7384.5, "2h3m4.5s"),
        (86400.0, "24h0m0s"),
    ],
)
def test_durations_are_written_as_openai_and_go_write_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


GO_DURATION = re.compile(r"^(?:0s|\d+ms|(?:\d+h)?(?:\d+m)?\d+(?:\.\d{1,3})?s)$")


@pytest.mark.parametrize("seconds", [0.0004, 0.5, 1.0, 2.0004, 59.9999, 61.0, 3599.9999, 3600.0001, 123456.789])
def test_every_duration_parses_back_to_at_least_the_wait(seconds: float) -> None:
    text = go_duration(seconds)
    assert GO_DURATION.match(text), text
    if text.endswith("ms"):
        back = int(text[:-2]) / 1000
    else:
        parts = {unit: value for value, unit in re.findall(r"([\d.]+)([hms])", text)}
        back = float(parts.get("h", 0)) * 3600 + float(parts.get("m", 0)) * 60 + float(parts.get("s", 0))
    assert seconds <= back < seconds + 0.001 + 1e-9


def test_rounding_up_never_yields_zero_for_a_real_wait_nor_a_second_for_float_noise() -> None:
    assert ceil_seconds(0.0) == 0 and ceil_seconds(1e-12) == 0
    assert ceil_seconds(0.001) == 1 and ceil_seconds(1.0) == 1 and ceil_seconds(1.0000001) == 2
    assert ceil_seconds(2.0000000000000004) == 2  # (cost - level) / rate computed in floats
    assert ceil_ms(0.0000001) == 1 and ceil_ms(1.8) == 1800 and ceil_ms(1.8000001) == 1801


def test_every_response_of_a_limited_key_carries_the_four_headers() -> None:
    st = BucketState(limit=10_000, remaining=7000, debt=0, reset_s=3.0004)
    assert rate_limit_headers(st) == {
        "X-RateLimit-Limit-Tokens": "10000",
        "X-RateLimit-Remaining-Tokens": "7000",
        "X-RateLimit-Reset": "4",  # seconds until full, rounded up
        "x-ratelimit-reset-tokens": "3.001s",
    }
    full = rate_limit_headers(state_of(10_000.0, TokenLimit(burst=10_000, tpm=60_000)))
    assert full["X-RateLimit-Reset"] == "0" and full["x-ratelimit-reset-tokens"] == "0s"
    assert rate_limit_headers(None) == {}  # an unlimited key
    unmetered = Decision(BucketVerdict.UNMETERED, 10, 10_000, 0, 0, 0.0)
    assert rate_limit_headers(unmetered) == {}  # failing open: nothing to report


LIMIT = TokenLimit(burst=10_000, tpm=60_000)


def test_a_limited_request_gets_429_with_the_real_wait_rounded_up() -> None:
    d = decision_of(BucketVerdict.LIMITED, 3000, 1200.0, LIMIT)  # 1,800 tokens short at 1,000 a second
    err = refusal_error(d)
    assert (err.type, err.status, err.retry_after) == ("rate_limit_exceeded", 429, 2)
    assert err.headers["retry-after-ms"] == "1800"
    assert err.headers["X-RateLimit-Remaining-Tokens"] == "1200" and err.headers["X-RateLimit-Reset"] == "9"
    assert "Retry-After" not in err.headers  # the envelope renders retry_after itself
    assert "x-should-retry" not in err.headers
    for number in ("3000", "1200", "10000", "1.8 s"):
        assert number in err.message, err.message


def test_a_limited_request_of_a_key_in_debt_is_told_about_the_debt() -> None:
    d = decision_of(BucketVerdict.LIMITED, 1, -2000.0, LIMIT)
    err = refusal_error(d)
    assert err.retry_after == 3 and err.headers["retry-after-ms"] == "2001"
    assert "owes 2000 tokens" in err.message and "2.001 s" in err.message


def test_a_tiny_wait_is_still_a_wait() -> None:
    d = decision_of(BucketVerdict.LIMITED, 100, 100.0 - 1e-4, LIMIT)  # 0.1 us short
    err = refusal_error(d)
    assert err.retry_after == 1 and err.headers["retry-after-ms"] == "1"


def test_a_request_above_the_capacity_gets_413_and_should_not_be_retried() -> None:
    d = decision_of(BucketVerdict.TOO_LARGE, 12_000, 10_000.0, LIMIT)
    err = refusal_error(d, param="max_tokens")
    assert (err.type, err.status, err.param, err.retry_after) == ("request_exceeds_capacity", 413, "max_tokens", None)
    assert err.headers["x-should-retry"] == "false" and "retry-after-ms" not in err.headers
    assert err.headers["X-RateLimit-Limit-Tokens"] == "10000"
    assert "12000" in err.message and "10000" in err.message


def test_an_admitted_decision_is_not_a_refusal() -> None:
    with pytest.raises(ValueError):
        refusal_error(decision_of(BucketVerdict.ADMITTED, 1, 9999.0, LIMIT))


def test_an_unreachable_limiter_is_503_with_retry_after() -> None:
    err = unavailable_error()
    assert (err.type, err.status, err.retry_after) == ("rate_limiter_unavailable", 503, 1)


def test_the_new_types_have_their_statuses() -> None:
    assert STATUS["rate_limit_exceeded"] == 429
    assert STATUS["request_exceeds_capacity"] == 413
    assert STATUS["rate_limiter_unavailable"] == 503
