"""Requests in flight per key: a semaphore in this process, and one shared by replicas in Redis whose slots a dead
replica cannot hold for longer than their lease."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from sluicegate.tenancy.ratelimit.concurrency import InProcessConcurrency, RedisConcurrency
from tests.ratelimit.conftest import REDIS_URL


async def _exercise(a: InProcessConcurrency | RedisConcurrency, b: InProcessConcurrency | RedisConcurrency) -> None:
    """`a` and `b`: two holders of one key's slots (two replicas, or the same process twice)."""
    assert (await a.acquire("k", "r1", 2)).granted
    second = await b.acquire("k", "r2", 2)
    assert second.granted and second.in_flight == 2
    full = await a.acquire("k", "r3", 2)
    assert not full.granted and full.in_flight == 2
    assert (await b.acquire("other", "r4", 2)).granted  # keys are apart
    await a.release("k", "r1")
    await a.release("k", "r1")  # idempotent
    assert (await b.acquire("k", "r3", 2)).granted


def test_in_process() -> None:
    c = InProcessConcurrency()
    asyncio.run(_exercise(c, c))


def test_redis_is_shared_and_a_dead_holders_slot_expires(redis_prefix: str) -> None:
    async def main() -> None:
        one, two = Redis.from_url(REDIS_URL), Redis.from_url(REDIS_URL)
        a = RedisConcurrency(one, key_prefix=redis_prefix, lease_s=30.0)
        b = RedisConcurrency(two, key_prefix=redis_prefix, lease_s=30.0)
        try:
            await _exercise(a, b)
            # a replica that dies holding a slot (nothing renews it) frees it when its lease runs out
            dead = RedisConcurrency(one, key_prefix=redis_prefix, lease_s=0.3)
            assert (await dead.acquire("d", "gone", 1)).granted
            await dead.close()  # stops its renewals, as a killed process would
            assert not (await b.acquire("d", "new", 1)).granted
            for _ in range(200):
                if (await b.acquire("d", "new", 1)).granted:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the dead holder's slot never expired")
            # a live holder's lease is renewed past it
            live = RedisConcurrency(one, key_prefix=redis_prefix, lease_s=0.3)
            assert (await live.acquire("l", "long", 1)).granted
            await asyncio.sleep(1.0)
            assert not (await b.acquire("l", "late", 1)).granted
            await live.close()
        finally:
            await a.close()
            await b.close()
            await one.aclose()
            await two.aclose()

    asyncio.run(main())
