"""Rate limiter cost: one reserve + settle, in-process and on Redis, median and p99.

    PYTHONPATH=src .venv/bin/python bench/ratelimit.py [--runs 20000] [--redis-runs 5000] [--redis-url URL]

Each sample is one `await reserve(...)` followed by one `await settle(...)` (a refund of half the cost), one at a
time on one event loop, timed with perf_counter_ns: the latency one request adds, not a throughput. Keys rotate
over 100 so the buckets are not all one; the limit admits everything (a refusal is the same script, cheaper).
Redis runs use the shipped defaults (`RateLimitConfig`) on Redis's clock, under a fresh key prefix deleted after.
A warm-up of 10% of the runs is discarded. For reference, two PINGs on the same client: the round trips
alone. Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from bench.report import percentile  # noqa: E402
from sluicegate.config import RateLimitConfig  # noqa: E402
from sluicegate.tenancy.ratelimit import InProcessRateLimiter, RateLimiter, TokenLimit  # noqa: E402

LIMIT = TokenLimit(burst=10**12, tpm=10**12)  # admits everything: the admitted path is the one every request takes
KEYS = [f"key{i}" for i in range(100)]


async def sample(limiter: RateLimiter, runs: int) -> list[float]:
    """Microseconds per reserve + settle."""
    out: list[float] = []
    for i in range(runs + runs // 10):
        key = KEYS[i % len(KEYS)]
        t = time.perf_counter_ns()
        d = await limiter.reserve(key, 3000, LIMIT)
        await limiter.settle(key, d.reserved, 1500, LIMIT)
        dt = (time.perf_counter_ns() - t) / 1000
        if i >= runs // 10:
            out.append(dt)
    return out


async def two_pings(client: Any, runs: int) -> list[float]:
    """Microseconds per two PING round trips on the same client: the floor under reserve + settle."""
    out: list[float] = []
    for i in range(runs + runs // 10):
        t = time.perf_counter_ns()
        await client.ping()
        await client.ping()
        if i >= runs // 10:
            out.append((time.perf_counter_ns() - t) / 1000)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--redis-runs", type=int, default=5000)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()

    rows: list[tuple[str, int, list[float]]] = []
    rows.append(("in-process", args.runs, await sample(InProcessRateLimiter(), args.runs)))

    import redis

    from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter

    prefix = f"sgbench:rl:{uuid.uuid4().hex}:"
    limiter = RedisRateLimiter.from_config(RateLimitConfig(redis_url=args.redis_url, key_prefix=prefix))
    try:
        rows.append(("Redis (127.0.0.1, Lua, Redis TIME)", args.redis_runs, await sample(limiter, args.redis_runs)))
        rows.append(("for reference: two Redis PINGs, same client", args.redis_runs,
                     await two_pings(limiter.client, args.redis_runs)))
    finally:
        await limiter.close()
        with redis.Redis.from_url(args.redis_url) as r:
            keys = list(r.scan_iter(match=prefix + "*"))
            if keys:
                r.delete(*keys)
            version = r.info("server")["redis_version"]

    load = os.getloadavg()
    print(f"Python {platform.python_version()}, Redis {version}, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| limiter | runs | median (us) | p99 (us) |")
    print("|---|---|---|---|")
    for name, n, xs in rows:
        print(f"| {name} | {n} | {percentile(xs, 0.5):.1f} | {percentile(xs, 0.99):.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
