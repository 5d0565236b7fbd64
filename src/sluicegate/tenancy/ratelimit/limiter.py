"""The rate limiter interface, its in-process implementation, fail-open, and the factory from config.

The serving path holds one `RateLimiter` and, per request whose key has a limit:

    decision = await limiter.reserve(key_id, cost, limit)      # at admission; may raise RateLimiterUnavailable
    ... refuse unless decision.allowed; answer with rate_limit_headers(decision) ...
    await limiter.settle(key_id, decision.reserved, actual, limit)   # when it ends, whatever the ending

The interface is async because the Redis implementation does network I/O on the event loop; the in-process
one answers without awaiting anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit.bucket import BucketState, BucketVerdict, Decision, TokenBuckets, TokenLimit

if TYPE_CHECKING:
    from sluicegate.tenancy.ratelimit.concurrency import ConcurrencyLimiter

log = logging.getLogger("sluicegate.ratelimit")


class RateLimiterUnavailable(Exception):
    """The shared limiter (Redis) could not answer in time: unreachable, timed out, or erroring.

    The route maps it to 503 `rate_limiter_unavailable` (fail closed), unless the limiter was built with
    `fail_open`, in which case this never escapes `reserve`/`settle`/`peek`.
    """


@runtime_checkable
class RateLimiter(Protocol):
    """Token-priced limits per key. `key` is the API key's id (never the secret)."""

    remote: bool  # each call is a round trip to another server (Redis), worth overlapping with other waits

    async def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        """Reserve `cost` tokens at admission. ADMITTED, LIMITED (with retry_after_s), TOO_LARGE (cost above
        the capacity: never admissible), or UNMETERED (fail-open while the store is unreachable)."""
        ...

    async def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState | None:
        """When the request ends: refund `reserved - actual`, or record the excess as a debt. Pass
        `decision.reserved` (0 unless ADMITTED). None when failing open while the store is unreachable."""
        ...

    async def peek(self, key: str, limit: TokenLimit) -> BucketState | None:
        """The bucket now, unchanged (for responses refused before admission). None when failing open."""
        ...

    async def close(self) -> None: ...


class InProcessRateLimiter:
    """One replica's limiter: `TokenBuckets` behind the async interface (nothing is awaited)."""

    remote = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.buckets = TokenBuckets(clock)

    async def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        return self.buckets.reserve(key, cost, limit)

    async def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState | None:
        return self.buckets.settle(key, reserved, actual, limit)

    async def peek(self, key: str, limit: TokenLimit) -> BucketState | None:
        return self.buckets.peek(key, limit)

    async def close(self) -> None:
        return None


class EveryMinute:
    """True at most once per `period_s`: keeps an outage from writing a log line per request."""

    def __init__(self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._period = period_s
        self._clock = clock
        self._last: float | None = None

    def __call__(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self._period:
            return False
        self._last = now
        return True


class FailOpen:
    """Admits, unmetered, whatever `inner` cannot answer; logs that at most once a minute.

    The trade: while the store is down every key is unlimited (and gets no rate-limit headers), instead of every
    request being refused. Reservations made while it was down are never settled (there is nothing to settle).
    """

    def __init__(self, inner: RateLimiter, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.remote = inner.remote
        self._should_log = EveryMinute(clock=clock)

    def _opened(self, exc: RateLimiterUnavailable) -> None:
        if self._should_log():
            log.warning("rate limiter unavailable (%s); failing open: requests are admitted unmetered", exc)

    async def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        try:
            return await self.inner.reserve(key, cost, limit)
        except RateLimiterUnavailable as exc:
            self._opened(exc)
            return Decision(BucketVerdict.UNMETERED, cost, limit.burst, 0, 0, 0.0)

    async def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState | None:
        try:
            return await self.inner.settle(key, reserved, actual, limit)
        except RateLimiterUnavailable as exc:
            self._opened(exc)
            return None

    async def peek(self, key: str, limit: TokenLimit) -> BucketState | None:
        try:
            return await self.inner.peek(key, limit)
        except RateLimiterUnavailable as exc:
            self._opened(exc)
            return None

    async def close(self) -> None:
        await self.inner.close()


def resolve_limit(tpm: int | None, burst: int | None, config: RateLimitConfig) -> TokenLimit | None:
    """A key's effective limit: its own `tpm`/`burst`, else the config's defaults; None means unlimited.

    No rate (neither the key nor the default sets one) means unlimited, whatever the burst. A rate without a
    burst gets one minute of tokens as its capacity (`burst = tpm`).
    """
    rate = tpm if tpm is not None else config.default_tpm
    if rate is None:
        return None
    cap = burst if burst is not None else config.default_burst
    return TokenLimit(burst=cap if cap is not None else rate, tpm=rate)


def build_rate_limiter(config: RateLimitConfig) -> RateLimiter:
    """In-process buckets when `redis_url` is None, else Redis; wrapped in `FailOpen` when `fail_open`.

    Building a Redis limiter opens no connection (the first request does), so a server starts with Redis down.
    """
    limiter: RateLimiter
    if config.redis_url is None:
        limiter = InProcessRateLimiter()
    else:
        from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter

        limiter = RedisRateLimiter.from_config(config)
    return FailOpen(limiter) if config.fail_open else limiter


def build_concurrency_limiter(config: RateLimitConfig, limiter: RateLimiter) -> ConcurrencyLimiter:
    """Requests in flight per key: in process, or in the same Redis (and connection pool) as `limiter`'s buckets;
    failing open as `limiter` does."""
    from sluicegate.tenancy.ratelimit.concurrency import (
        FailOpenConcurrency,
        InProcessConcurrency,
        RedisConcurrency,
    )

    inner = limiter.inner if isinstance(limiter, FailOpen) else limiter
    client = getattr(inner, "client", None)
    made: ConcurrencyLimiter
    if client is None:
        made = InProcessConcurrency()
    else:
        made = RedisConcurrency(client, key_prefix=config.key_prefix, lease_s=config.concurrency_lease_s,
                                op_timeout_s=config.op_timeout_s)
    return FailOpenConcurrency(made) if config.fail_open else made
