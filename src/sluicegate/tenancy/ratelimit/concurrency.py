"""Requests in flight per API key: a counting semaphore, in this process or shared by every replica in Redis.

A key's slots are a real resource (each request holds an engine slot, a connection, memory), so a key may be
limited to N at once beside its token rate. A request takes a slot before its body is read and gives it back
when its response has ended (a stream at its end, a client that left when it left).

In Redis a key's holders are one sorted set, `<prefix>conc:<key id>`, scored by each holder's lease expiry (Redis
time). Taking a slot is one Lua script: drop expired holders, count, add this one if under the limit. Each
process renews the leases it holds every third of `lease_s` (one `ZADD XX` per held slot, pipelined), so a
replica that dies (`kill -9`) frees its slots within `lease_s` instead of holding them forever, and a request
longer than the lease keeps its slot. Giving back is a `ZREM`. A Redis that does not answer raises
`RateLimiterUnavailable`, which the caller treats as it does for token buckets (fail closed, or open with
`--rate-limit-fail-open`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sluicegate.tasks import cancel
from sluicegate.tenancy.ratelimit.limiter import RateLimiterUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("sluicegate.ratelimit")


@dataclass(frozen=True, slots=True)
class Slot:
    granted: bool
    in_flight: int  # the key's requests in flight, this one included when granted
    limit: int


class ConcurrencyLimiter(Protocol):
    async def acquire(self, key: str, holder: str, limit: int) -> Slot:
        """Take one of the key's `limit` slots for `holder` (unique per request), or say it is full."""
        ...

    async def release(self, key: str, holder: str) -> None:
        """Give the slot back (idempotent)."""
        ...

    async def close(self) -> None: ...


def _forget(held: dict[str, set[str]], key: str, holder: str) -> None:
    holders = held.get(key)
    if holders is not None:
        holders.discard(holder)
        if not holders:
            del held[key]


class InProcessConcurrency:
    def __init__(self) -> None:
        self._held: dict[str, set[str]] = defaultdict(set)

    async def acquire(self, key: str, holder: str, limit: int) -> Slot:
        held = self._held[key]
        if len(held) >= limit:
            return Slot(False, len(held), limit)
        held.add(holder)
        return Slot(True, len(held), limit)

    async def release(self, key: str, holder: str) -> None:
        _forget(self._held, key, holder)

    async def close(self) -> None:
        self._held.clear()


_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then return {0, n} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return {1, n + 1}
"""

_RENEW = """
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until_, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 1000))
return 1
"""


class RedisConcurrency:
    def __init__(self, client: Redis, *, key_prefix: str = "sluicegate:rl:", lease_s: float = 30.0,
                 op_timeout_s: float = 0.5) -> None:
        self.client = client
        self.prefix = key_prefix + "conc:"
        self.lease_s = lease_s
        self._op_timeout = op_timeout_s
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._held: dict[str, set[str]] = defaultdict(set)
        self._renewer: asyncio.Task[None] | None = None

    async def _run(self, call: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(self._op_timeout):
                return await call
        except (RedisError, OSError, TimeoutError) as exc:
            raise RateLimiterUnavailable(type(exc).__name__) from exc

    async def acquire(self, key: str, holder: str, limit: int) -> Slot:
        granted, n = await self._run(self._acquire(keys=[self.prefix + key], args=[holder, limit, self.lease_s]))
        if int(granted):
            self._held[key].add(holder)
            if self._renewer is None:
                self._renewer = asyncio.create_task(self._renew_loop())
        return Slot(bool(int(granted)), int(n), limit)

    async def release(self, key: str, holder: str) -> None:
        _forget(self._held, key, holder)
        try:
            await self._run(self.client.zrem(self.prefix + key, holder))
        except RateLimiterUnavailable:  # its lease runs out instead
            log.warning("could not give back a concurrency slot of key %s; it frees within %.0f s", key,
                        self.lease_s)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for key, holders in list(self._held.items()):
                if holders:
                    with contextlib.suppress(RateLimiterUnavailable):
                        await self._run(self._renew(keys=[self.prefix + key], args=[self.lease_s, *holders]))

    async def close(self) -> None:
        await cancel(self._renewer)
        self._renewer = None


class FailOpenConcurrency:
    """Grants whatever `inner` cannot answer (`--rate-limit-fail-open`)."""

    def __init__(self, inner: ConcurrencyLimiter) -> None:
        self.inner = inner

    async def acquire(self, key: str, holder: str, limit: int) -> Slot:
        try:
            return await self.inner.acquire(key, holder, limit)
        except RateLimiterUnavailable:
            return Slot(True, 0, limit)

    async def release(self, key: str, holder: str) -> None:
        with contextlib.suppress(RateLimiterUnavailable):
            await self.inner.release(key, holder)

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["ConcurrencyLimiter", "FailOpenConcurrency", "InProcessConcurrency", "RedisConcurrency", "Slot"]
