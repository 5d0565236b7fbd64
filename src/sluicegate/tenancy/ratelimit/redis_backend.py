"""Buckets shared by many replicas in Redis: one atomic Lua script per decision, on Redis's clock.

Each bucket is a hash `{prefix}{key}` with `l` (level, tokens) and `t` (as of, microseconds). Every operation
is one script run (EVALSHA): Redis runs a script atomically, so two replicas reserving at once are serialised
there, and no read-modify-write races across the network. Time comes from `redis.call('TIME')` inside the
script, so replicas on machines with different clocks share one clock. The arithmetic is `bucket.py`'s, in Lua
(keep the two in step; the behavioural tests run over both). A bucket's key expires when the refill would
have filled it anyway (an absent bucket reads as full), so idle keys cost Redis nothing.

Failures are bounded: short connect and socket timeouts, at most `retries` immediate retries, and a hard
`op_timeout_s` around each call (the wait for a pooled connection included); anything that goes wrong becomes
`RateLimiterUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit.bucket import (
    EPSILON,
    BucketState,
    BucketVerdict,
    Decision,
    TokenLimit,
    check_counts,
    decision_of,
    state_of,
)
from sluicegate.tenancy.ratelimit.limiter import EveryMinute, RateLimiterUnavailable

log = logging.getLogger("sluicegate.ratelimit")

# KEYS[1] the bucket; ARGV[1] burst, ARGV[2] tpm, ARGV[3] now in microseconds ('' = Redis TIME, the default;
# a clock is injected only by tests). Defines `level` (refilled to now), `now`, `burst`, `rate` (tokens/us),
# and `store(level)`, which writes the bucket and its expiry, or deletes it when full. The expiry runs on Redis's
# own clock, so under an injected clock a key lives an hour longer (a slow test must not see it vanish).
_PROLOGUE = """
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 60000000
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end
local level = burst
local saved = redis.call('HMGET', KEYS[1], 'l', 't')
if saved[1] then
  level = math.min(burst, tonumber(saved[1]) + math.max(0, now - tonumber(saved[2])) * rate)
end
local function store(lv)
  if lv >= burst then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 'l', string.format('%.17g', lv), 't', string.format('%.17g', now))
    local ttl = math.ceil((burst - lv) / rate / 1000) + 1000
    if ARGV[3] ~= '' then ttl = ttl + 3600000 end
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
"""

# ARGV[4] cost. Returns {outcome, level after}: 0 admitted, 1 limited, 2 too large.
_RESERVE = _PROLOGUE + f"""
local cost = tonumber(ARGV[4])
if cost > burst then
  return {{2, string.format('%.17g', level)}}
end
if level + {EPSILON!r} >= cost then
  level = level - cost
  store(level)
  return {{0, string.format('%.17g', level)}}
end
return {{1, string.format('%.17g', level)}}
"""

# ARGV[4] reserved, ARGV[5] actual. Returns the level after.
_SETTLE = _PROLOGUE + """
level = math.min(burst, level + tonumber(ARGV[4]) - tonumber(ARGV[5]))
store(level)
return string.format('%.17g', level)
"""

_PEEK = _PROLOGUE + """
return string.format('%.17g', level)
"""

_VERDICTS = (BucketVerdict.ADMITTED, BucketVerdict.LIMITED, BucketVerdict.TOO_LARGE)


class RedisRateLimiter:
    """A `RateLimiter` over Redis (redis-py's asyncio client). Build it with `from_config`.

    `clock` (seconds, monotonic) replaces Redis's TIME: for tests that must step time exactly. Leave it None
    in service, where the point is one clock for every replica.
    """

    remote = True

    def __init__(
        self,
        client: Redis,
        *,
        key_prefix: str = "sluicegate:rl:",
        op_timeout_s: float = 0.5,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._op_timeout = op_timeout_s
        self._clock = clock
        self._should_log = EveryMinute()
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._peek = client.register_script(_PEEK)

    @classmethod
    def from_config(cls, config: RateLimitConfig, clock: Callable[[], float] | None = None) -> RedisRateLimiter:
        if config.redis_url is None:
            raise ValueError("RateLimitConfig.redis_url is not set")
        # A blocking pool: a burst beyond `max_connections` waits for a free connection (within op_timeout_s)
        # instead of failing at once, as redis-py's default pool does beyond its 100.
        pool = BlockingConnectionPool.from_url(
            config.redis_url,
            max_connections=config.max_connections,
            timeout=config.op_timeout_s,
            socket_connect_timeout=config.connect_timeout_s,
            socket_timeout=config.socket_timeout_s,
            retry=Retry(NoBackoff(), config.retries),
            decode_responses=True,
        )
        client = Redis.from_pool(pool)
        return cls(client, key_prefix=config.key_prefix, op_timeout_s=config.op_timeout_s, clock=clock)

    def _args(self, limit: TokenLimit, *more: int) -> list[str | int]:
        now = "" if self._clock is None else f"{self._clock() * 1e6:.17g}"
        return [limit.burst, limit.tpm, now, *more]

    async def _run(self, script: AsyncScript, key: str, args: Sequence[str | int]) -> Any:
        try:
            async with asyncio.timeout(self._op_timeout):
                return await script(keys=[self.key_prefix + key], args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if self._should_log():
                log.warning("rate limiter: Redis did not answer (%s)", reason)
            raise RateLimiterUnavailable(reason) from exc

    async def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        check_counts(cost=cost)
        code, level = await self._run(self._reserve, key, self._args(limit, cost))
        return decision_of(_VERDICTS[int(code)], cost, float(level), limit)

    async def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState | None:
        check_counts(reserved=reserved, actual=actual)
        level = await self._run(self._settle, key, self._args(limit, reserved, actual))
        return state_of(float(level), limit)

    async def peek(self, key: str, limit: TokenLimit) -> BucketState | None:
        level = await self._run(self._peek, key, self._args(limit))
        return state_of(float(level), limit)

    async def close(self) -> None:
        await self.client.aclose()

