"""Fixtures for the rate limiter: a fake clock, and one driver per implementation (in-process, Redis).

Redis tests use the machine's real Redis at 127.0.0.1:6379, each under its own key prefix (deleted after),
and skip with the reason when it is not reachable.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit import BucketState, Decision, InProcessRateLimiter, RateLimiter, TokenLimit
from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_absent() -> str | None:
    """Why Redis cannot be used here, or None when it answers."""
    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1) as r:
            r.ping()
    except redis.RedisError as exc:
        return f"Redis is not reachable at 127.0.0.1:6379 ({type(exc).__name__}: {exc})"
    return None


def need_redis() -> None:
    why = redis_absent()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh key prefix for one test; its keys are deleted afterwards."""
    need_redis()
    prefix = f"sgtest:rl:{uuid.uuid4().hex}:"
    yield prefix
    with redis.Redis.from_url(REDIS_URL) as r:
        keys = list(r.scan_iter(match=prefix + "*"))
        if keys:
            r.delete(*keys)


def redis_config(prefix: str) -> RateLimitConfig:
    return RateLimitConfig(redis_url=REDIS_URL, key_prefix=prefix)


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Driver:
    """A limiter driven synchronously on its own event loop (the Redis client is bound to one loop)."""

    limiter: RateLimiter
    clock: FakeClock
    loop: asyncio.AbstractEventLoop
    limit: TokenLimit

    def reserve(self, cost: int, key: str = "k", limit: TokenLimit | None = None) -> Decision:
        return self.loop.run_until_complete(self.limiter.reserve(key, cost, limit or self.limit))

    def settle(self, reserved: int, actual: int, key: str = "k", limit: TokenLimit | None = None) -> BucketState:
        got = self.loop.run_until_complete(self.limiter.settle(key, reserved, actual, limit or self.limit))
        assert got is not None
        return got

    def peek(self, key: str = "k", limit: TokenLimit | None = None) -> BucketState:
        got = self.loop.run_until_complete(self.limiter.peek(key, limit or self.limit))
        assert got is not None
        return got


# The worked example of docs/ratelimits.md: capacity 10,000 tokens, 60,000 tokens a minute (1,000 a second).
EXAMPLE = TokenLimit(burst=10_000, tpm=60_000)


@pytest.fixture(params=["in-process", "redis"])
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """The same behavioural tests over both implementations, on a fake clock."""
    clock = FakeClock()
    loop = asyncio.new_event_loop()
    limiter: RateLimiter
    if request.param == "in-process":
        limiter = InProcessRateLimiter(clock)
    else:
        prefix = request.getfixturevalue("redis_prefix")
        limiter = RedisRateLimiter.from_config(redis_config(prefix), clock=clock)
    try:
        yield Driver(limiter, clock, loop, EXAMPLE)
    finally:
        loop.run_until_complete(limiter.close())
        loop.close()
