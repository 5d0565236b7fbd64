"""The cached key lookup on SQLite and Postgres: one query per key per TTL, unknown keys remembered too, a
revocation made through another engine seen once the TTL has passed, malformed keys never queried."""

from __future__ import annotations

import asyncio

from sluicegate.store.db import Store
from sluicegate.tenancy.key_cache import KeyCache
from sluicegate.tenancy.keys import Scope, create_key, new_secret, revoke_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_hits_do_not_query_and_the_ttl_bounds_a_revocation(db_url: str) -> None:
    admin = Store.open(db_url)  # another engine: as another process would
    served = Store.open(db_url)
    clock = Clock()
    try:
        record, secret = create_key(admin, "k", {Scope.GENERATE})
        cache = KeyCache(served, ttl_s=0.5, clock=clock)

        async def scenario() -> None:
            assert await cache.lookup(secret) == record
            assert cache.query_count == 1
            for _ in range(100):
                assert await cache.lookup(secret) == record
            assert cache.query_count == 1 and cache.hits == 100
            revoke_key(admin, record.id)
            clock.now += 0.49
            got = await cache.lookup(secret)
            assert got is not None and got.revoked_at is None  # still within the TTL: the cached answer
            clock.now += 0.02
            got = await cache.lookup(secret)  # past the TTL: asked again, and the revocation is seen
            assert got is not None and got.revoked_at is not None and not got.usable()
            assert cache.query_count == 2

        asyncio.run(scenario())
    finally:
        admin.close()
        served.close()


def test_unknown_keys_are_remembered_and_malformed_ones_never_asked(db_url: str) -> None:
    store = Store.open(db_url)
    clock = Clock()
    try:
        cache = KeyCache(store, ttl_s=0.5, max_unknown=3, clock=clock)
        unknown = [new_secret() for _ in range(4)]

        async def scenario() -> None:
            for _ in range(50):
                assert await cache.lookup(unknown[0]) is None
            assert cache.query_count == 1
            assert await cache.lookup("sg_live_short") is None
            assert await cache.lookup(unknown[1][:-1] + ("A" if unknown[1][-1] != "A" else "B")) is None
            assert await cache.lookup("Bearer " + unknown[1]) is None
            assert cache.query_count == 1  # malformed: no query
            for key in unknown[1:]:  # three more unknown keys push the first out (at most 3 remembered)
                assert await cache.lookup(key) is None
            assert cache.query_count == 4 and len(cache._unknown) == 3
            assert await cache.lookup(unknown[0]) is None
            assert cache.query_count == 5
            # a key created meanwhile is found at once: only keys looked up before are remembered as unknown
            record, secret = create_key(store, "late")
            assert await cache.lookup(secret) == record

        asyncio.run(scenario())
    finally:
        store.close()


def test_concurrent_lookups_of_one_key_share_one_query(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        record, secret = create_key(store, "k")
        cache = KeyCache(store)

        async def scenario() -> None:
            results = await asyncio.gather(*(cache.lookup(secret) for _ in range(50)))
            assert all(r == record for r in results)
            assert cache.query_count == 1

        asyncio.run(scenario())
    finally:
        store.close()


def test_found_keys_are_bounded(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        made = [create_key(store, f"k{i}") for i in range(5)]
        cache = KeyCache(store, max_keys=2)

        async def scenario() -> None:
            for record, secret in made:
                assert await cache.lookup(secret) == record
            assert len(cache._found) == 2

        asyncio.run(scenario())
    finally:
        store.close()


def test_enforced_once_a_key_exists_and_for_good(db_url: str) -> None:
    admin = Store.open(db_url)
    served = Store.open(db_url)
    clock = Clock()
    try:
        cache = KeyCache(served, ttl_s=0.5, clock=clock)

        async def scenario() -> None:
            assert not await cache.enforced()
            record, _ = create_key(admin, "first")
            assert not await cache.enforced()  # the cached "no key" answer, within its TTL
            clock.now += 0.5
            assert await cache.enforced()
            revoke_key(admin, record.id)
            clock.now += 10
            assert await cache.enforced()  # revoking every key does not switch auth off

        asyncio.run(scenario())
    finally:
        admin.close()
        served.close()
