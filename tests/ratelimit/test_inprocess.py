"""The in-process buckets: concurrency from threads, memory, fail-open, limits from config."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable

import pytest

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit import (
    BucketVerdict,
    FailOpen,
    InProcessRateLimiter,
    RateLimiterUnavailable,
    TokenBuckets,
    TokenLimit,
    build_rate_limiter,
    rate_limit_headers,
    resolve_limit,
)
from sluicegate.tenancy.ratelimit.bucket import EPSILON, BucketState, Decision
from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter
from tests.ratelimit.conftest import EXAMPLE, FakeClock


def hammer(threads: int, body: Callable[[], None]) -> None:
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        body()

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_threads_on_a_frozen_clock_admit_exactly_the_capacity() -> None:
    buckets = TokenBuckets(FakeClock())
    limit = TokenLimit(burst=1000, tpm=60)
    admitted: list[int] = []

    def body() -> None:
        mine = sum(buckets.reserve("k", 1, limit).allowed for _ in range(400))
        admitted.append(mine)

    hammer(8, body)  # 3,200 attempts at 1 token for 1,000 tokens
    assert sum(admitted) == 1000


def test_threads_on_the_real_clock_never_take_more_than_capacity_plus_refill() -> None:
    buckets = TokenBuckets()  # time.monotonic
    limit = TokenLimit(burst=2000, tpm=600_000)  # 10,000 tokens a second: the refill matters within the test
    taken: list[int] = []

    def body() -> None:
        rng = random.Random()
        mine = 0
        for _ in range(3000):
            cost = rng.randint(1, 40)
            d = buckets.reserve("k", cost, limit)
            if d.allowed:
                actual = rng.randint(0, cost)  # some refund
                buckets.settle("k", d.reserved, actual, limit)
                mine += actual
        taken.append(mine)

    t0 = time.monotonic()
    hammer(6, body)
    elapsed = time.monotonic() - t0
    assert 0 < sum(taken) <= limit.burst + limit.rate * elapsed + EPSILON


def test_full_buckets_are_forgotten() -> None:
    clock = FakeClock()
    buckets = TokenBuckets(clock)
    buckets.reserve("a", 100, EXAMPLE)
    assert len(buckets) == 1
    buckets.settle("a", 100, 0, EXAMPLE)  # refunded to full: nothing to remember
    assert len(buckets) == 0
    for i in range(10):
        buckets.reserve(f"k{i}", 1000, EXAMPLE)
    assert len(buckets) == 10
    clock.advance(1.0)  # 1,000 tokens of refill: all full again, and the sweep drops them
    for _ in range(TokenBuckets.SWEEP_EVERY):
        buckets.settle("busy", 1, 1, EXAMPLE)
    assert len(buckets) == 0


def test_limits_resolve_from_the_key_then_the_defaults() -> None:
    none = RateLimitConfig()
    assert resolve_limit(None, None, none) is None  # no rate anywhere: unlimited
    assert resolve_limit(None, 5000, none) is None  # a burst without a rate limits nothing
    assert resolve_limit(60_000, None, none) == TokenLimit(burst=60_000, tpm=60_000)  # a minute of tokens
    assert resolve_limit(60_000, 10_000, none) == TokenLimit(burst=10_000, tpm=60_000)
    dflt = RateLimitConfig(default_tpm=1200, default_burst=300)
    assert resolve_limit(None, None, dflt) == TokenLimit(burst=300, tpm=1200)
    assert resolve_limit(60_000, None, dflt) == TokenLimit(burst=300, tpm=60_000)
    assert resolve_limit(None, 50, dflt) == TokenLimit(burst=50, tpm=1200)
    with pytest.raises(ValueError):
        TokenLimit(burst=0, tpm=10)
    with pytest.raises(ValueError):
        TokenLimit(burst=10, tpm=0)


def test_the_factory_builds_what_the_config_says() -> None:
    assert isinstance(build_rate_limiter(RateLimitConfig()), InProcessRateLimiter)
    redis_limiter = build_rate_limiter(RateLimitConfig(redis_url="redis://127.0.0.1:6379/0"))
    assert isinstance(redis_limiter, RedisRateLimiter)  # no connection is opened yet
    failing_open = build_rate_limiter(RateLimitConfig(redis_url="redis://127.0.0.1:6379/0", fail_open=True))
    assert isinstance(failing_open, FailOpen) and isinstance(failing_open.inner, RedisRateLimiter)

    async def close() -> None:
        await redis_limiter.close()
        await failing_open.close()

    asyncio.run(close())


class Down:
    """A limiter whose store is unreachable."""

    remote = True

    def __init__(self) -> None:
        self.calls = 0

    async def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        self.calls += 1
        raise RateLimiterUnavailable("ConnectionError: refused")

    async def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState | None:
        self.calls += 1
        raise RateLimiterUnavailable("ConnectionError: refused")

    async def peek(self, key: str, limit: TokenLimit) -> BucketState | None:
        self.calls += 1
        raise RateLimiterUnavailable("ConnectionError: refused")

    async def close(self) -> None:
        return None


def test_fail_open_admits_unmetered_without_headers_and_logs_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    down = Down()
    limiter = FailOpen(down, clock=clock)

    async def calls() -> list[object]:
        return [
            await limiter.reserve("k", 3000, EXAMPLE),
            await limiter.reserve("k", 3000, EXAMPLE),
            await limiter.settle("k", 0, 3000, EXAMPLE),
            await limiter.peek("k", EXAMPLE),
        ]

    with caplog.at_level(logging.WARNING, logger="sluicegate.ratelimit"):
        first, second, settled, peeked = asyncio.run(calls())
        assert isinstance(first, Decision) and isinstance(second, Decision)
        assert first.outcome is BucketVerdict.UNMETERED and first.allowed and first.reserved == 0
        assert rate_limit_headers(first) == {} and settled is None and peeked is None
        assert down.calls == 4
        assert len(caplog.records) == 1 and "failing open" in caplog.records[0].getMessage()
        clock.advance(60.0)
        asyncio.run(limiter.reserve("k", 1, EXAMPLE))
        assert len(caplog.records) == 2

