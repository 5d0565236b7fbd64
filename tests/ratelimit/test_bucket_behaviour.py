"""The cost bucket's behaviour, the same tests over the in-process and the Redis limiter, on a fake clock.

The limit is docs/ratelimits.md's worked example: capacity 10,000 tokens, 60,000 a minute (1,000 a second).
"""

from __future__ import annotations

import pytest

from sluicegate.tenancy.ratelimit import BucketVerdict, TokenLimit
from tests.ratelimit.conftest import Driver


def test_a_fresh_key_starts_full_and_a_reservation_takes_its_cost(driver: Driver) -> None:
    assert driver.peek() == driver.peek()  # peeking changes nothing
    assert driver.peek().remaining == 10_000 and driver.peek().reset_s == 0
    d = driver.reserve(3000)
    assert d.outcome is BucketVerdict.ADMITTED and d.allowed and d.reserved == 3000
    assert (d.limit, d.remaining, d.debt, d.retry_after_s) == (10_000, 7000, 0, None)
    assert d.reset_s == pytest.approx(3.0)  # 3,000 tokens at 1,000 a second
    assert driver.peek().remaining == 7000


def test_refused_with_the_exact_refill_time_and_admitted_exactly_then(driver: Driver) -> None:
    for _ in range(3):
        assert driver.reserve(3000).allowed
    d = driver.reserve(3000)  # 1,000 left; 2,000 more take 2 s
    assert d.outcome is BucketVerdict.LIMITED and not d.allowed and d.reserved == 0
    assert d.remaining == 1000 and d.retry_after_s == pytest.approx(2.0, abs=1e-9)
    assert driver.peek().remaining == 1000  # a refusal takes nothing
    driver.clock.advance(2.0 - 0.001)
    early = driver.reserve(3000)
    assert early.outcome is BucketVerdict.LIMITED and early.retry_after_s == pytest.approx(0.001, abs=1e-9)
    driver.clock.advance(0.001)
    late = driver.reserve(3000)
    assert late.outcome is BucketVerdict.ADMITTED and late.remaining == 0
    assert late.reset_s == pytest.approx(10.0)


def test_the_refill_is_continuous_and_stops_at_the_capacity(driver: Driver) -> None:
    assert driver.reserve(10_000).remaining == 0
    driver.clock.advance(0.25)
    assert driver.peek().remaining == 250
    driver.clock.advance(3600)
    assert driver.peek().remaining == 10_000 and driver.peek().reset_s == 0


def test_settling_under_the_reservation_refunds_the_rest(driver: Driver) -> None:
    d = driver.reserve(3000)
    st = driver.settle(d.reserved, 1200)
    assert st.remaining == 8800 and st.debt == 0
    assert st.reset_s == pytest.approx(1.2)


def test_a_refund_never_fills_beyond_the_capacity(driver: Driver) -> None:
    d = driver.reserve(5000)
    driver.clock.advance(60)  # the bucket refilled meanwhile
    assert driver.settle(d.reserved, 0).remaining == 10_000


def test_a_debt_is_paid_before_the_next_admission(driver: Driver) -> None:
    d = driver.reserve(9000)  # 1,000 left
    st = driver.settle(d.reserved, 12_000)  # used 3,000 more than reserved: the level is -2,000
    assert (st.remaining, st.debt) == (0, 2000)
    assert st.reset_s == pytest.approx(12.0)
    one = driver.reserve(1)  # even one token waits for the debt: 2,001 tokens of refill
    assert one.outcome is BucketVerdict.LIMITED and one.debt == 2000
    assert one.retry_after_s == pytest.approx(2.001, abs=1e-9)
    driver.clock.advance(2.0)  # debt paid, bucket empty
    assert driver.peek().debt == 0 and driver.peek().remaining == 0
    assert driver.reserve(1).outcome is BucketVerdict.LIMITED
    driver.clock.advance(0.001)
    assert driver.reserve(1).outcome is BucketVerdict.ADMITTED


def test_a_cost_above_the_capacity_is_never_admissible(driver: Driver) -> None:
    d = driver.reserve(10_001)
    assert d.outcome is BucketVerdict.TOO_LARGE and not d.allowed and d.retry_after_s is None
    assert d.remaining == 10_000  # nothing taken
    assert driver.reserve(10_000).outcome is BucketVerdict.ADMITTED  # exactly the capacity fits a full bucket
    assert driver.reserve(10_001).outcome is BucketVerdict.TOO_LARGE  # too large, not merely limited, when empty too


def test_keys_have_their_own_buckets(driver: Driver) -> None:
    assert driver.reserve(10_000, key="a").allowed
    assert not driver.reserve(1, key="a").allowed
    assert driver.reserve(10_000, key="b").allowed


def test_a_clock_that_goes_backwards_refills_nothing(driver: Driver) -> None:
    driver.reserve(4000)
    driver.clock.advance(-5.0)
    assert driver.peek().remaining == 6000
    driver.reserve(1000)  # stored as of the earlier time; the refill counts from there
    driver.clock.advance(1.0)
    assert driver.peek().remaining == 6000


def test_a_changed_limit_applies_to_the_level_the_key_has(driver: Driver) -> None:
    small = TokenLimit(burst=500, tpm=600)
    assert driver.reserve(3000).remaining == 7000
    assert driver.peek(limit=small).remaining == 500  # a smaller capacity clamps the level
    d = driver.reserve(100, limit=small)
    assert (d.limit, d.remaining) == (500, 400)
    assert d.reset_s == pytest.approx(10.0)  # 10 tokens a second
    back = driver.reserve(3000)  # a larger limit again gives no tokens for free
    assert back.outcome is BucketVerdict.LIMITED and back.remaining == 400
    assert back.retry_after_s == pytest.approx(2.6)


def test_negative_token_counts_are_refused(driver: Driver) -> None:
    with pytest.raises(ValueError):
        driver.reserve(-5)
    with pytest.raises(ValueError):
        driver.settle(0, -5)
    with pytest.raises(ValueError):
        driver.settle(-5, 0)
    assert driver.peek().remaining == 10_000
