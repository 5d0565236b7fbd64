"""A replica's side of the shared-Redis tests: its own limiter, many concurrent clients, one key.

Runs in a spawned process (a module, not a test file, so the child imports little).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit import TokenLimit
from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter

CLIENTS = 8  # concurrent requests per replica


def replica(url: str, prefix: str, limit: TokenLimit, frozen_attempts: int, seed: int,
            ready: Any, go: Any, stop: Any, results: Any) -> None:
    """`frozen_attempts` > 0: every client makes that many 1-token reservations on a frozen clock and stops.
    0: on Redis's clock, clients reserve 1-50 tokens and settle a little less, until `stop` is set.
    Puts ("ok", accepted tokens, admissions, refusals) or ("error", repr) on `results`."""
    try:
        results.put(("ok", *asyncio.run(_run(url, prefix, limit, frozen_attempts, seed, ready, go, stop))))
    except BaseException as exc:  # report, so the parent fails instead of waiting
        results.put(("error", repr(exc)))


async def _run(url: str, prefix: str, limit: TokenLimit, frozen_attempts: int, seed: int,
               ready: Any, go: Any, stop: Any) -> tuple[int, int, int]:
    clock = (lambda: 1000.0) if frozen_attempts else None
    limiter = RedisRateLimiter.from_config(RateLimitConfig(redis_url=url, key_prefix=prefix), clock=clock)
    counts = [0, 0, 0]  # accepted tokens, admissions, refusals

    async def client(rng: random.Random) -> None:
        attempts = 0
        while (attempts < frozen_attempts) if frozen_attempts else not stop.is_set():
            attempts += 1
            cost = 1 if frozen_attempts else rng.randint(1, 50)
            d = await limiter.reserve("k", cost, limit)
            if not d.allowed:
                counts[2] += 1
                continue
            actual = cost if frozen_attempts else cost - rng.randint(0, cost // 4)
            if actual != cost:
                await limiter.settle("k", d.reserved, actual, limit)
            counts[0] += actual
            counts[1] += 1

    try:
        await limiter.peek("k", limit)  # connected, scripts loaded: ready before the clock starts
        ready.put(None)
        await asyncio.to_thread(go.wait)
        await asyncio.gather(*(client(random.Random(seed * 1000 + i)) for i in range(CLIENTS)))
    finally:
        await limiter.close()
    return counts[0], counts[1], counts[2]
