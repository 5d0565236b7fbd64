"""The Redis limiter beyond the shared behaviour: failure, Redis's clock, expiry, and replicas sharing one Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from sluicegate.config import RateLimitConfig
from sluicegate.tenancy.ratelimit import (
    BucketVerdict,
    FailOpen,
    RateLimiterUnavailable,
    TokenLimit,
    build_rate_limiter,
    rate_limit_headers,
)
from sluicegate.tenancy.ratelimit.redis_backend import RedisRateLimiter
from tests.ratelimit.conftest import EXAMPLE, REDIS_URL, FakeClock, redis_config
from tests.ratelimit.replicas import replica

HANG_GUARD_S = 30.0  # only so a hang fails the test instead of the suite; the limiter's own bound is op_timeout_s


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


def server_time(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec + usec / 1e6


async def every_call(limiter: RedisRateLimiter | FailOpen) -> list[Any]:
    out: list[Any] = []
    for call in (limiter.reserve("k", 1, EXAMPLE), limiter.settle("k", 1, 1, EXAMPLE), limiter.peek("k", EXAMPLE)):
        try:
            out.append(await asyncio.wait_for(call, HANG_GUARD_S))
        except RateLimiterUnavailable as exc:
            out.append(exc)
    await limiter.close()
    return out


def test_redis_refusing_connections_makes_the_limiter_unavailable() -> None:
    limiter = RedisRateLimiter.from_config(RateLimitConfig(redis_url=f"redis://127.0.0.1:{closed_port()}/0"))
    got = asyncio.run(every_call(limiter))
    assert all(isinstance(x, RateLimiterUnavailable) for x in got), got
    assert "ConnectionError" in str(got[0])


def test_a_redis_that_never_answers_times_out_into_unavailable(black_hole: int) -> None:
    config = RateLimitConfig(redis_url=f"redis://127.0.0.1:{black_hole}/0", connect_timeout_s=0.05,
                             socket_timeout_s=0.05, op_timeout_s=0.2)
    got = asyncio.run(every_call(RedisRateLimiter.from_config(config)))
    assert all(isinstance(x, RateLimiterUnavailable) for x in got), got
    assert all("Timeout" in str(x) for x in got), got  # the timeouts fired; nothing hung


def test_the_configured_fail_open_admits_unmetered_when_redis_is_down() -> None:
    limiter = build_rate_limiter(RateLimitConfig(redis_url=f"redis://127.0.0.1:{closed_port()}/0", fail_open=True))
    assert isinstance(limiter, FailOpen)
    decision, settled, peeked = asyncio.run(every_call(limiter))
    assert decision.outcome is BucketVerdict.UNMETERED and decision.allowed and rate_limit_headers(decision) == {}
    assert settled is None and peeked is None


def test_buckets_run_on_redis_time_and_replicas_see_one_bucket(redis_prefix: str) -> None:
    async def run() -> tuple[float, float, float, int, int, int]:
        a = RedisRateLimiter.from_config(redis_config(redis_prefix))
        b = RedisRateLimiter.from_config(redis_config(redis_prefix))
        r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            before = server_time(r)
            d = await a.reserve("k", 4000, EXAMPLE)
            after = server_time(r)
            assert d.outcome is BucketVerdict.ADMITTED
            seen = await b.peek("k", EXAMPLE)  # the other replica sees the reservation
            assert seen is not None and 6000 <= seen.remaining <= 6000 + 1000 * (server_time(r) - before) + 1
            stored_t = float(r.hget(redis_prefix + "k", "t")) / 1e6  # type: ignore[arg-type]
            ttl = int(r.pttl(redis_prefix + "k"))
            full = await b.settle("k", 4000, 0, EXAMPLE)  # refunded to full: the key goes
            assert full is not None and full.remaining == 10_000
            return before, stored_t, after, ttl, int(r.exists(redis_prefix + "k")), seen.remaining
        finally:
            await a.close()
            await b.close()
            r.close()

    before, stored_t, after, ttl, exists, _ = asyncio.run(run())
    assert before <= stored_t <= after  # stamped with Redis's TIME, not a replica's clock
    assert 0 < ttl <= 4000 + 1000  # expires once the refill would have filled it (4 s), plus a second's margin
    assert exists == 0


def test_concurrent_reservations_on_one_replica_never_exceed_the_capacity(redis_prefix: str) -> None:
    limit = TokenLimit(burst=500, tpm=60)

    async def run() -> int:
        # 1,200 at once through 50 connections: a loaded machine may take seconds, which is not what is tested
        config = dataclasses.replace(redis_config(redis_prefix), op_timeout_s=60.0)
        limiter = RedisRateLimiter.from_config(config, clock=FakeClock())
        try:
            got = await asyncio.gather(*(limiter.reserve("k", 1, limit) for _ in range(1200)))
        finally:
            await limiter.close()
        return sum(d.allowed for d in got)

    assert asyncio.run(run()) == 500


def run_replicas(prefix: str, limit: TokenLimit, frozen_attempts: int, window_s: float) -> dict[str, Any]:
    """Two replica processes, each with its own limiter on one Redis key; returns their totals and Redis times."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=replica, args=(REDIS_URL, prefix, limit, frozen_attempts, seed, ready, go, stop, results))
        for seed in (1, 2)
    ]
    for p in procs:
        p.start()
    r = redis.Redis.from_url(REDIS_URL)
    try:
        for _ in procs:
            ready.get(timeout=120)
        t0 = server_time(r)
        go.set()
        if window_s:
            time.sleep(window_s)  # the measurement window itself, not a wait for something to happen
        t_stop = server_time(r)
        stop.set()
        outs = [results.get(timeout=120) for _ in procs]
        t1 = server_time(r)
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        r.close()
    errors = [o for o in outs if o[0] != "ok"]
    assert not errors, errors
    return {
        "accepted": sum(o[1] for o in outs), "admitted": sum(o[2] for o in outs), "refused": sum(o[3] for o in outs),
        "per_replica": [o[1] for o in outs], "t0": t0, "t_stop": t_stop, "t1": t1,
    }


def test_two_replicas_on_a_frozen_clock_admit_exactly_the_capacity(redis_prefix: str) -> None:
    got = run_replicas(redis_prefix, TokenLimit(burst=1000, tpm=60), frozen_attempts=100, window_s=0)
    assert got["accepted"] == 1000 and got["admitted"] == 1000 and got["refused"] == 2 * 8 * 100 - 1000
    assert all(n > 0 for n in got["per_replica"])  # both replicas took part


def test_two_replicas_hold_the_key_to_its_rate_within_five_percent(redis_prefix: str) -> None:
    limit = TokenLimit(burst=3000, tpm=60_000)  # 1,000 tokens a second
    got = run_replicas(redis_prefix, limit, frozen_attempts=0, window_s=3.0)
    ceiling = limit.burst + limit.rate * (got["t1"] - got["t0"])  # everything the bucket could have given
    floor = limit.burst + limit.rate * (got["t_stop"] - got["t0"])  # what it had given by the stop signal
    print(f"\naccepted {got['accepted']} tokens ({got['per_replica']}) in {got['admitted']} admissions, "
          f"{got['refused']} refusals; capacity + rate x elapsed = {floor:.0f} at stop, {ceiling:.0f} at the end")
    assert all(n > 0 for n in got["per_replica"])
    assert got["accepted"] <= ceiling
    assert got["accepted"] >= 0.95 * floor
